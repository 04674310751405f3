"""The Redis store's Lua scripts: every write is one script, so it is atomic.

Redis runs a script to its end before any other command, so no reader ever
sees half an exchange. A script that fails part-way keeps what it already
wrote, so each write script checks everything that can fail (a duplicate
request id, a stale cached chain) before its first write, and is declared
with a ``#!lua`` shebang: Redis then refuses it *before* it starts when the
server is out of memory, instead of failing it half-way (Redis 7.0+).

Key layout under the store's prefix ``P`` (``S`` a session id, ``N`` a
session's name: tenant and key, length-prefixed so no key can forge another):

    P n:N      string  the session id of name N
    P s:S      hash    t tenant, k key, c created, u updated, h head item id,
                       n item count, w stored tokens, f newest fencing token
    P p:S      hash    path hash -> item id
    P a:S      hash    item id -> parent item id ('' for a root)
    P i:S      hash    item id -> the item as JSON (path hash, content hash,
                       role, tokens, status, created, message)
    P x:S      hash    word (stemmed) -> its postings: "item id,tf,length,position;"...
                       (in chunks of 4 KB: word, word#1, word#2..., word#n their count)
                       (the recall index, when one is kept; s:S holds xn items indexed,
                       xl their length)
    P v:S      list    the items' vectors in the order written: "item id:position:
                       content hash:vector bytes" (proxy/store/redis_vectors.py)
    P y:S      set     the item ids with a vector in v:S
    P m:S      hash    summary id -> the summary as JSON
    P g:S      hash    "covered path hash:start unit" -> summary id (one per range)
    P o:S      hash    response id -> the response row as JSON
    P e:S      hash    response id -> "head item id:input head item id"
    P q:N      hash    request id -> the request row as JSON (rows by name:
                       those made before the session existed included)
    P l:N      list    the name's request ids, in the order written
    P r:ID     string  a request row without a session name
    P rid      hash    request id -> N (so one row is found by id)
    P upd      zset    "session id (zero-padded):tenant" by updated time; P upd:T per tenant
    P resp     hash    "T:response id" -> S; P rt:ID set: tenants with that response id
    P seq:s, seq:i, seq:m   id counters (never reused, like SQLite's AUTOINCREMENT)

Every per-session key (and the name's request rows) carries the session's
TTL, renewed by each write that moves ``updated``; the global indexes do not
expire, so every read through one checks that the session it points at still
exists (and drops the entry when not), and each sweep (DELETE_IDLE) also
takes one bounded step through them (``P gc:*`` hold its cursors).
"""

from __future__ import annotations

# Shared by every script: key names and the few steps several scripts take.
PRELUDE = r"""
local P = ARGV[1]
local function nm(tenant, key) return #tenant .. ':' .. tenant .. ':' .. key end
-- A session in the updated-time sets: its id, zero-padded so ties sort by id, and tenant.
local function member(sid, tenant) return string.format('%015d', tonumber(sid)) .. ':' .. tenant end
local function member_sid(m) return tostring(tonumber(string.sub(m, 1, 15))) end
local SESSION_KEYS = {'s:', 'p:', 'a:', 'i:', 'x:', 'm:', 'g:', 'o:', 'e:', 'v:', 'y:'}

local function live_sid(name)
  local sid = redis.call('GET', P .. 'n:' .. name)
  if sid and redis.call('EXISTS', P .. 's:' .. sid) == 1 then return sid end
  return false
end

local function session_keys(sid, name)
  local keys = {P .. 'n:' .. name, P .. 'q:' .. name, P .. 'l:' .. name}
  for _, k in ipairs(SESSION_KEYS) do keys[#keys + 1] = P .. k .. sid end
  return keys
end

-- Renew the session's TTL (a write that counts as activity).
local function expire_session(sid, name, ttl)
  if ttl == '0' then return end
  for _, k in ipairs(session_keys(sid, name)) do redis.call('PEXPIRE', k, ttl) end
end

-- Keys a write made without renewing the TTL get the session's remaining one.
local function adopt_ttl(sid, name)
  local left = redis.call('PTTL', P .. 's:' .. sid)
  if left <= 0 then return end
  for _, k in ipairs(session_keys(sid, name)) do
    if redis.call('PTTL', k) == -1 then redis.call('PEXPIRE', k, left) end
  end
end

local function session_info(sid)
  local h = redis.call('HMGET', P .. 's:' .. sid, 't', 'k', 'c', 'u', 'h', 'n', 'w')
  if not h[1] then return false end
  local requests = redis.call('HLEN', P .. 'q:' .. nm(h[1], h[2]))
  return {sid, h[1], h[2], h[3], h[4], h[5] or '', h[6], h[7], requests}
end

-- The chain from the root (or from after item ``stop``, when the walk meets it)
-- to item ``head``, appended to ``out``: id, json, id, json, ..., root first.
-- Returns ``out`` and whether the walk met ``stop``.
local function walk(sid, head, out, stop)
  local ids = {}
  local parents = P .. 'a:' .. sid
  while head and head ~= '' and head ~= stop do
    ids[#ids + 1] = head
    head = redis.call('HGET', parents, head)
  end
  local items = P .. 'i:' .. sid
  for i = #ids, 1, -1 do
    out[#out + 1] = ids[i]
    out[#out + 1] = redis.call('HGET', items, ids[i])
  end
  return out, stop ~= nil and head == stop
end
"""

# A write's steps: a session made or touched, a chain stored, a request row.
_WRITES = r"""
local function request_taken(rid)
  if redis.call('EXISTS', P .. 'r:' .. rid) == 1 then return true end
  local name = redis.call('HGET', P .. 'rid', rid)
  return name and redis.call('HEXISTS', P .. 'q:' .. name, rid) == 1
end

local function new_session(tenant, key, now)
  local sid = tostring(redis.call('INCR', P .. 'seq:s'))
  redis.call('SET', P .. 'n:' .. nm(tenant, key), sid)
  redis.call('HSET', P .. 's:' .. sid, 't', tenant, 'k', key, 'c', now, 'u', now, 'n', 0, 'w', 0)
  return sid
end

local function touch(sid, tenant, now)
  redis.call('HSET', P .. 's:' .. sid, 'u', now)
  redis.call('ZADD', P .. 'upd', now, member(sid, tenant))
  redis.call('ZADD', P .. 'upd:' .. tenant, now, member(sid, tenant))
end

-- A new item's words ("word:tf word:tf ...") in the session's inverted index: one
-- posting per word ("item id,term frequency,item length,position;", the length its
-- token count, 0 if unknown), appended in this same script.
-- A word's postings are chunks of at most POSTINGS_CHUNK bytes: field ``word``,
-- then ``word#1``, ``word#2``... (``word#n``: how many after the first), so an
-- append copies one chunk, not every posting of a word the session says often.
local POSTINGS_CHUNK = 4096
local function index_item(sid, id, position, length, terms)
  if terms == '' then return end
  local index = P .. 'x:' .. sid
  local entry = id .. ',%s,' .. length .. ',' .. position .. ';'
  for word, tf in string.gmatch(terms, '([^ :]+):(%d+)') do
    local chunks = tonumber(redis.call('HGET', index, word .. '#n') or '0')
    local field = word
    if chunks > 0 then field = word .. '#' .. chunks end
    local posting = redis.call('HGET', index, field) or ''
    local add = string.format(entry, tf)
    if #posting + #add > POSTINGS_CHUNK then
      chunks = chunks + 1
      field, posting = word .. '#' .. chunks, ''
      redis.call('HSET', index, word .. '#n', chunks)
    end
    redis.call('HSET', index, field, posting .. add)
  end
  redis.call('HINCRBY', P .. 's:' .. sid, 'xn', 1)
  redis.call('HINCRBY', P .. 's:' .. sid, 'xl', length)
end

-- Store the chain's items from ARGV[base] on (path, tokens, json, words
-- quadruples), the first one a child of ``parent``; ``first`` is its position
-- in the whole chain, ``conv`` how many of the chain's items are the conversation.
local function store_chain(sid, parent, first, count, base, conv)
  local paths, parents, items = P .. 'p:' .. sid, P .. 'a:' .. sid, P .. 'i:' .. sid
  local ids, new, added, tokens = {}, 0, 0, 0
  for i = 1, count do
    local j = base + 4 * (i - 1)
    local id = redis.call('HGET', paths, ARGV[j])
    if not id then
      id = tostring(redis.call('INCR', P .. 'seq:i'))
      redis.call('HSET', paths, ARGV[j], id)
      redis.call('HSET', parents, id, parent)
      redis.call('HSET', items, id, ARGV[j + 2])
      index_item(sid, id, first + i - 1, ARGV[j + 1], ARGV[j + 3])
      added = added + 1
      tokens = tokens + tonumber(ARGV[j + 1])
      if first + i - 1 < conv then new = new + 1 end
    end
    ids[i] = id
    parent = id
  end
  if added > 0 then
    redis.call('HINCRBY', P .. 's:' .. sid, 'n', added)
    redis.call('HINCRBY', P .. 's:' .. sid, 'w', tokens)
  end
  return ids, new
end

-- The items sent without their words ('?') that the session does not have:
-- the caller computes words only for those (a resent history is mostly known).
local function unindexed(sid, count, base)
  local out = {}
  for i = 1, count do
    local j = base + 4 * (i - 1)
    if ARGV[j + 3] == '?' then
      if not (sid and redis.call('HEXISTS', P .. 'p:' .. sid, ARGV[j]) == 1) then
        out[#out + 1] = i
      end
    end
  end
  return out
end

-- An item id given as 'k<id>' (known to the caller), 's<n>' (the n-th item
-- this script stored) or 'n' (none).
local function resolve(spec, ids)
  local c = string.sub(spec, 1, 1)
  if c == 'k' then return string.sub(spec, 2) end
  if c == 's' then return ids[tonumber(string.sub(spec, 2))] end
  return false
end

local function json_id(id) return id or 'null' end

local function write_row(name, rid, head, sid, ids, specs, ttl)
  local dropped = {}
  for spec in string.gmatch(specs[4], '[^,]+') do dropped[#dropped + 1] = resolve(spec, ids) end
  local row = head .. ',"session_id":' .. json_id(sid)
    .. ',"dropped_item_ids":[' .. table.concat(dropped, ',') .. ']'
    .. ',"first_item_id":' .. json_id(resolve(specs[1], ids))
    .. ',"last_item_id":' .. json_id(resolve(specs[2], ids))
    .. ',"reply_item_id":' .. json_id(resolve(specs[3], ids)) .. '}'
  if name == '' then
    redis.call('SET', P .. 'r:' .. rid, row)
    if ttl ~= '0' then redis.call('PEXPIRE', P .. 'r:' .. rid, ttl) end
  else
    redis.call('HSET', P .. 'q:' .. name, rid, row)
    redis.call('RPUSH', P .. 'l:' .. name, rid)
    redis.call('HSET', P .. 'rid', rid, name)
  end
end
"""

# ARGV: 1 prefix, 2 mode (row: no session nor name | named: no session | fail:
# no items | chain | response), 3 tenant, 4 key, 5 now, 6 ttl ms ('0': none), 7 request id,
# 8 the request row's JSON without its id fields and closing brace,
# 9 the cached session id, 10 the parent of the first item sent, 11 how many
# items of the chain the caller knows (not sent), 12 the conversation's
# length, 13-16 first, last, reply item and dropped (comma-separated) specs,
# 17 the new head's spec, 18 response id, 19 the response row's JSON without
# its id fields and closing brace, 20 the response's input head spec,
# 21 the session lock's fencing token ('' for none), 22 how many items
# follow, 23... (path hash, tokens, item JSON, words) quadruples.
# Returns {'dup'}, {'fenced'} (a newer lock holder has written), {'stale'}
# (the cached session is gone: resend it all), {'words', n...} (the n-th
# items sent are new: resend with their words) or
# {'ok', session id or '', new messages, id of each item sent...}.
RECORD = (
    "#!lua\n"
    + PRELUDE
    + _WRITES
    + r"""
local mode, tenant, key, now, ttl, rid = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local specs = {ARGV[13], ARGV[14], ARGV[15], ARGV[16]}
if request_taken(rid) then return {'dup'} end
local name = ''
if mode ~= 'row' then name = nm(tenant, key) end
if mode == 'row' or mode == 'named' or mode == 'fail' then
  -- No items: only the request row (the session, if any, is left as it was).
  local sid = false
  if mode == 'fail' then sid = live_sid(name) end
  write_row(name, rid, ARGV[8], sid, {}, specs, ttl)
  if name ~= '' then
    local any = live_sid(name)
    if any then adopt_ttl(any, name)
    elseif ttl ~= '0' then
      redis.call('PEXPIRE', P .. 'q:' .. name, ttl)
      redis.call('PEXPIRE', P .. 'l:' .. name, ttl)
    end
  end
  return {'ok', sid or ''}
end

local sid = live_sid(name)
local known = tonumber(ARGV[11])
-- The cached chain holds if its session is the same and its last item is
-- still there (a deleted response's items go, and only from a chain's end).
if known > 0 and (ARGV[9] ~= sid or redis.call('HEXISTS', P .. 'a:' .. sid, ARGV[10]) == 0) then
  return {'stale'}
end
-- A session-lock fencing token older than one written before: that lock was lost.
local fence = ARGV[21]
if fence ~= '' and sid then
  if tonumber(fence) < tonumber(redis.call('HGET', P .. 's:' .. sid, 'f') or '0') then
    return {'fenced'}
  end
end
local missing = unindexed(sid, tonumber(ARGV[22]), 23)
if #missing > 0 then return {'words', unpack(missing)} end
if not sid then sid = new_session(tenant, key, now) end
touch(sid, tenant, now)
if fence ~= '' then redis.call('HSET', P .. 's:' .. sid, 'f', fence) end
local ids, new = store_chain(sid, ARGV[10], known, tonumber(ARGV[22]), 23, tonumber(ARGV[12]))
local head = resolve(ARGV[17], ids)
if head then redis.call('HSET', P .. 's:' .. sid, 'h', head) end
write_row(name, rid, ARGV[8], sid, ids, specs, ttl)
if mode == 'response' then
  local resp, field = ARGV[18], #tenant .. ':' .. tenant .. ':' .. ARGV[18]
  local old = redis.call('HGET', P .. 'resp', field)
  if old and old ~= sid then
    redis.call('HDEL', P .. 'o:' .. old, resp)
    redis.call('HDEL', P .. 'e:' .. old, resp)
  end
  local input = resolve(ARGV[20], ids)
  redis.call('HSET', P .. 'resp', field, sid)
  redis.call('SADD', P .. 'rt:' .. resp, tenant)
  redis.call('HSET', P .. 'o:' .. sid, resp, ARGV[19] .. ',"session_id":' .. sid
    .. ',"head_item_id":' .. json_id(head) .. ',"input_head_item_id":' .. json_id(input) .. '}')
  redis.call('HSET', P .. 'e:' .. sid, resp, (head or '') .. ':' .. (input or ''))
end
expire_session(sid, name, ttl)
local out = {'ok', sid, new}
for i = 1, #ids do out[#out + 1] = ids[i] end
return out
"""
)

# ARGV: 1 prefix, 2 tenant, 3 key, 4 now, 5 ttl ms, 6 cached session id,
# 7 parent of the first item sent, 8 items known (not sent), 9 the range
# ("covered path hash:start unit"), 10 the summary's JSON without its opening
# brace and id fields, 11 the covered item's spec, 12 how many items follow,
# 13... quadruples. Returns {'stale'}, {'words', n...} or {'ok', summary JSON} (the stored one
# when the range had one already: the first writer wins).
SAVE_SUMMARY = (
    "#!lua\n"
    + PRELUDE
    + _WRITES
    + r"""
local tenant, key, now, ttl = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local name = nm(tenant, key)
local sid = live_sid(name)
local known = tonumber(ARGV[8])
if known > 0 and (ARGV[6] ~= sid or redis.call('HEXISTS', P .. 'a:' .. sid, ARGV[7]) == 0) then
  return {'stale'}
end
local missing = unindexed(sid, tonumber(ARGV[12]), 13)
if #missing > 0 then return {'words', unpack(missing)} end
local created = false
if not sid then
  -- Created if new (updated now); an existing session's activity time does not move.
  sid = new_session(tenant, key, now)
  redis.call('ZADD', P .. 'upd', now, member(sid, tenant))
  redis.call('ZADD', P .. 'upd:' .. tenant, now, member(sid, tenant))
  created = true
end
local found = redis.call('HGET', P .. 'g:' .. sid, ARGV[9])
if found then return {'ok', redis.call('HGET', P .. 'm:' .. sid, found)} end
local ids = store_chain(sid, ARGV[7], known, tonumber(ARGV[12]), 13, 0)
local id = tostring(redis.call('INCR', P .. 'seq:m'))
local json = '{"id":' .. id .. ',"session_id":' .. sid
  .. ',"covers_item_id":' .. resolve(ARGV[11], ids) .. ',' .. ARGV[10]
redis.call('HSET', P .. 'm:' .. sid, id, json)
redis.call('HSET', P .. 'g:' .. sid, ARGV[9], id)
if created then expire_session(sid, name, ttl) else adopt_ttl(sid, name) end
return {'ok', json}
"""
)

_DELETES = r"""
local function drop_name(name)
  local q = P .. 'q:' .. name
  local ids = redis.call('HKEYS', q)
  for i = 1, #ids, 500 do
    redis.call('HDEL', P .. 'rid', unpack(ids, i, math.min(i + 499, #ids)))
  end
  redis.call('UNLINK', q, P .. 'l:' .. name)
end

local function drop_session(sid, tenant, key)
  local name = nm(tenant, key)
  for _, resp in ipairs(redis.call('HKEYS', P .. 'o:' .. sid)) do
    redis.call('HDEL', P .. 'resp', #tenant .. ':' .. tenant .. ':' .. resp)
    redis.call('SREM', P .. 'rt:' .. resp, tenant)
  end
  for _, k in ipairs(SESSION_KEYS) do redis.call('UNLINK', P .. k .. sid) end
  if redis.call('GET', P .. 'n:' .. name) == sid then redis.call('DEL', P .. 'n:' .. name) end
  redis.call('ZREM', P .. 'upd', member(sid, tenant))
  redis.call('ZREM', P .. 'upd:' .. tenant, member(sid, tenant))
  drop_name(name)
end
"""

# ARGV: 1 prefix, 2 tenant, 3 key. Returns 1 if there was a session.
DELETE_SESSION = (
    "#!lua\n"
    + PRELUDE
    + _DELETES
    + r"""
local tenant, key = ARGV[2], ARGV[3]
local sid = live_sid(nm(tenant, key))
if not sid then drop_name(nm(tenant, key)) return 0 end
drop_session(sid, tenant, key)
return 1
"""
)

# ARGV: 1 prefix, 2 cutoff, 3 batch size. Returns {sessions looked at, deleted}.
DELETE_IDLE = (
    "#!lua\n"
    + PRELUDE
    + _DELETES
    + r"""
local members = redis.call('ZRANGEBYSCORE', P .. 'upd', '-inf', '(' .. ARGV[2],
  'LIMIT', 0, tonumber(ARGV[3]))
local deleted = 0
for _, m in ipairs(members) do
  local sid = member_sid(m)
  local h = redis.call('HMGET', P .. 's:' .. sid, 't', 'k')
  if h[1] then
    drop_session(sid, h[1], h[2])
    deleted = deleted + 1
  else
    -- Expired natively already: only its index entries were left.
    redis.call('ZREM', P .. 'upd', m)
    redis.call('ZREM', P .. 'upd:' .. string.sub(m, 17), m)
  end
end

-- One step through the global hashes, for entries of sessions that expired natively.
local function collect(index, stale)
  local cursor_key = P .. 'gc:' .. index
  local found = redis.call('HSCAN', P .. index, redis.call('GET', cursor_key) or '0', 'COUNT', 500)
  for i = 1, #found[2], 2 do stale(found[2][i], found[2][i + 1]) end
  if found[1] == '0' then
    redis.call('DEL', cursor_key)
  else
    redis.call('SET', cursor_key, found[1])
  end
end
collect('rid', function(rid, name)
  if redis.call('HEXISTS', P .. 'q:' .. name, rid) == 0 then redis.call('HDEL', P .. 'rid', rid) end
end)
collect('resp', function(field, sid)
  local digits = string.match(field, '^(%d+):')
  local tenant = string.sub(field, #digits + 2, #digits + 1 + tonumber(digits))
  local resp = string.sub(field, #digits + 3 + tonumber(digits))
  if redis.call('HEXISTS', P .. 'o:' .. sid, resp) == 0 then
    redis.call('HDEL', P .. 'resp', field)
    redis.call('SREM', P .. 'rt:' .. resp, tenant)
  end
end)
return {#members, deleted}
"""
)

# ARGV: 1 prefix, 2 tenant, 3 response id. Returns 1 if it was there. Deletes
# what only it holds (proxy/store/pruning.py): its mapping, its own request
# rows, the items only its chain reaches with their postings in the recall
# index and their vectors (emptied in place: readers' cursors are positions in
# the list), the summaries covering any of them; the session when nothing is left.
DELETE_RESPONSE = (
    "#!lua\n"
    + PRELUDE
    + _DELETES
    + r"""
local tenant, resp = ARGV[2], ARGV[3]
local field = #tenant .. ':' .. tenant .. ':' .. resp
local sid = redis.call('HGET', P .. 'resp', field)
local ends = sid and redis.call('HGET', P .. 'e:' .. sid, resp)
if not ends then
  if sid then
    redis.call('HDEL', P .. 'resp', field)
    redis.call('SREM', P .. 'rt:' .. resp, tenant)
  end
  return 0
end
local head = string.match(ends, '^([^:]*)')
redis.call('HDEL', P .. 'o:' .. sid, resp)
redis.call('HDEL', P .. 'e:' .. sid, resp)
redis.call('HDEL', P .. 'resp', field)
redis.call('SREM', P .. 'rt:' .. resp, tenant)
local s = P .. 's:' .. sid
local key = redis.call('HGET', s, 'k')
local name = nm(tenant, key)
local function id_of(v)
  if type(v) == 'number' then return string.format('%d', v) end
  return false
end

-- What else ends at an item: other responses, every other request row of the name.
local refs = {}
for _, other in ipairs(redis.call('HVALS', P .. 'e:' .. sid)) do
  for id in string.gmatch(other, '%d+') do refs[id] = true end
end
local q = P .. 'q:' .. name
local rows = redis.call('HGETALL', q)
for i = 1, #rows, 2 do
  local row = cjson.decode(rows[i + 1])
  local detail = row['detail']
  if type(detail) == 'table' and detail['response_id'] == resp then
    redis.call('HDEL', q, rows[i])
    redis.call('LREM', P .. 'l:' .. name, 0, rows[i])
    redis.call('HDEL', P .. 'rid', rows[i])
  else
    for _, column in ipairs({'last_item_id', 'reply_item_id'}) do
      local id = id_of(row[column])
      if id then refs[id] = true end
    end
  end
end
local session_head = redis.call('HGET', s, 'h') or ''
if session_head ~= '' and session_head ~= head then refs[session_head] = true end

-- The walk back from the response's last item.
local parents, children = {}, {}
local links = redis.call('HGETALL', P .. 'a:' .. sid)
for i = 1, #links, 2 do
  parents[links[i]] = links[i + 1]
  if links[i + 1] ~= '' then children[links[i + 1]] = (children[links[i + 1]] or 0) + 1 end
end
local gone, order = {}, {}
local item = head
while item and item ~= '' do
  local others = 0
  if #order > 0 then others = 1 end
  if refs[item] or (children[item] or 0) > others then break end
  gone[item] = true
  order[#order + 1] = item
  item = parents[item]
end

if #order > 0 then
  local items, tokens = P .. 'i:' .. sid, 0
  for _, id in ipairs(order) do
    local fields = cjson.decode(redis.call('HGET', items, id))
    redis.call('HDEL', P .. 'p:' .. sid, fields[1])
    if type(fields[4]) == 'number' then tokens = tokens + fields[4] end
    redis.call('HDEL', items, id)
    redis.call('HDEL', P .. 'a:' .. sid, id)
  end
  redis.call('HINCRBY', s, 'n', -#order)
  redis.call('HINCRBY', s, 'w', -tokens)
  -- The recall index: the items' postings, and their share of its statistics.
  local index, lengths, indexed, total = P .. 'x:' .. sid, {}, 0, 0
  local postings = redis.call('HGETALL', index)
  for i = 1, #postings, 2 do
    local kept = string.gsub(postings[i + 1], '(%d+),%d+,(%d+),%d+;', function(id, length)
      if gone[id] then
        if not lengths[id] then
          lengths[id] = true
          indexed, total = indexed + 1, total + tonumber(length)
        end
        return ''
      end
    end)
    if kept == '' then
      redis.call('HDEL', index, postings[i])
    elseif kept ~= postings[i + 1] then
      redis.call('HSET', index, postings[i], kept)
    end
  end
  if indexed > 0 then
    redis.call('HINCRBY', s, 'xn', -indexed)
    redis.call('HINCRBY', s, 'xl', -total)
  end
  -- Their vectors: the list's entries stay (cursors are positions in it), emptied.
  local vectors = P .. 'v:' .. sid
  local entries = redis.call('LRANGE', vectors, 0, -1)
  for i, entry in ipairs(entries) do
    local id = string.match(entry, '^(%d+):')
    if gone[id] then
      redis.call('LSET', vectors, i - 1, id .. ':0::')
      redis.call('SREM', P .. 'y:' .. sid, id)
    end
  end
  -- Summaries covering a deleted item (their text holds its content).
  local summaries = redis.call('HGETALL', P .. 'm:' .. sid)
  for i = 1, #summaries, 2 do
    local summary = cjson.decode(summaries[i + 1])
    if gone[id_of(summary['covers_item_id']) or ''] then
      redis.call('HDEL', P .. 'm:' .. sid, summaries[i])
      redis.call('HDEL', P .. 'g:' .. sid,
        summary['covers_path_hash'] .. ':' .. string.format('%d', summary['start_unit']))
    end
  end
  if gone[session_head] then
    local survivor = parents[order[#order]]
    if survivor and survivor ~= '' then redis.call('HSET', s, 'h', survivor)
    else redis.call('HDEL', s, 'h') end
  end
end

if redis.call('HLEN', P .. 'i:' .. sid) == 0 and redis.call('HLEN', P .. 'o:' .. sid) == 0
    and redis.call('HLEN', q) == 0 then
  drop_session(sid, tenant, key)
end
return 1
"""
)

# ARGV: 1 prefix, 2 tenant, 3 key, 4 fencing token. A new holder of the
# session's lock: the session's newest token rises to it (never falls), so a
# write with an older one is refused from now on. Not activity: nothing else moves.
ADVANCE_FENCE = (
    "#!lua\n"
    + PRELUDE
    + r"""
local sid = live_sid(nm(ARGV[2], ARGV[3]))
if not sid then return 0 end
local s = P .. 's:' .. sid
if tonumber(ARGV[4]) > tonumber(redis.call('HGET', s, 'f') or '0') then
  redis.call('HSET', s, 'f', ARGV[4])
end
return 1
"""
)
