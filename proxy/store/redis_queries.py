"""The Redis store's reads, each one Lua script (one round trip, one consistent view).

Key layout: proxy/store/redis_scripts.py. Reads that follow a global index
(request id, response id, the updated-time sets) drop an entry whose session
has expired natively, so a stale entry is never served and does not linger.
Pure reads are declared ``no-writes`` (they run on an out-of-memory server);
those that may drop a stale entry ``allow-oom`` (a deletion only frees memory).
"""

from __future__ import annotations

from proxy.store.redis_scripts import PRELUDE

_READ = "#!lua flags=no-writes\n" + PRELUDE
_CLEAN = "#!lua flags=allow-oom\n" + PRELUDE

# ARGV: 1 prefix, 2 tenant, 3 key, 4 the session id and 5 the head item id the
# caller holds the chain of ('' for none). Returns {} (no session), or {session
# id, head id ('' for none), 1 if the walk stopped at the caller's head else 0,
# then id, json, ... of the items after that head, root first}: nothing to walk
# when the head is the caller's, the whole chain when the walk reached the root
# (a branch, a shorter chain, another session of the same name).
HISTORY_SINCE = (
    _READ
    + r"""
local sid = live_sid(nm(ARGV[2], ARGV[3]))
if not sid then return {} end
local head = redis.call('HGET', P .. 's:' .. sid, 'h') or ''
local since = ''
if sid == ARGV[4] then since = ARGV[5] end
if head == '' or head == since then return {sid, head, '1'} end
local out, met = walk(sid, head, {sid, head, '0'}, since)
if met then out[3] = '1' end
return out
"""
)

# ARGV: 1 prefix, 2 tenant, 3 key. Returns session_info's fields or {}.
GET_SESSION = (
    _READ
    + r"""
local sid = live_sid(nm(ARGV[2], ARGV[3]))
if not sid then return {} end
return session_info(sid) or {}
"""
)

# ARGV: 1 prefix, 2 tenant ('' for all), 3 offset, 4 limit. Returns the
# sessions' fields one after another, newest activity first (id breaks ties).
LIST_SESSIONS = (
    _CLEAN
    + r"""
local zkey = P .. 'upd'
if ARGV[2] ~= '' then zkey = P .. 'upd:' .. ARGV[2] end
local offset, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
while true do
  -- Entries of expired sessions before the page would shift it: drop them first.
  local members = redis.call('ZREVRANGE', zkey, 0, offset + limit - 1)
  local out, stale = {}, {}
  for i, m in ipairs(members) do
    local info = session_info(member_sid(m))
    if not info then stale[#stale + 1] = m
    elseif i > offset then
      for _, v in ipairs(info) do out[#out + 1] = v end
    end
  end
  if #stale == 0 then return out end
  redis.call('ZREM', zkey, unpack(stale))
end
"""
)

# ARGV: 1 prefix, 2 tenant ('' for all), 3 offset, 4 limit, 5 part of a key. As
# LIST_SESSIONS, only sessions whose key contains ARGV[5] (plainly: no patterns).
# An admin search: it walks the updated-time set, newest first, reading one hash
# field per session until the page is full (a few ms per 10,000 sessions).
LIST_SESSIONS_MATCHING = (
    _CLEAN
    + r"""
local zkey = P .. 'upd'
if ARGV[2] ~= '' then zkey = P .. 'upd:' .. ARGV[2] end
local offset, limit, needle = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local out, stale, matched, start = {}, {}, 0, 0
while matched < offset + limit do
  local members = redis.call('ZREVRANGE', zkey, start, start + 499)
  if #members == 0 then break end
  start = start + #members
  for _, m in ipairs(members) do
    local sid = member_sid(m)
    local key = redis.call('HGET', P .. 's:' .. sid, 'k')
    if not key then stale[#stale + 1] = m
    elseif string.find(key, needle, 1, true) and matched < offset + limit then
      matched = matched + 1
      if matched > offset then
        for _, v in ipairs(session_info(sid)) do out[#out + 1] = v end
      end
    end
  end
end
for i = 1, #stale, 500 do redis.call('ZREM', zkey, unpack(stale, i, math.min(i + 499, #stale))) end
return out
"""
)

# ARGV: 1 prefix, 2 tenant, 3 key. Returns the name's request rows, in the order written.
REQUESTS = (
    _READ
    + r"""
local name = nm(ARGV[2], ARGV[3])
local ids = redis.call('LRANGE', P .. 'l:' .. name, 0, -1)
local out = {}
for i = 1, #ids, 500 do
  local rows = redis.call('HMGET', P .. 'q:' .. name, unpack(ids, i, math.min(i + 499, #ids)))
  for _, row in ipairs(rows) do if row then out[#out + 1] = row end end
end
return out
"""
)

# ARGV: 1 prefix, 2 request id. Returns the row or nil.
REQUEST = (
    _CLEAN
    + r"""
local rid = ARGV[2]
local row = redis.call('GET', P .. 'r:' .. rid)
if row then return row end
local name = redis.call('HGET', P .. 'rid', rid)
if not name then return false end
row = redis.call('HGET', P .. 'q:' .. name, rid)
if not row then redis.call('HDEL', P .. 'rid', rid) end
return row
"""
)

_RESPONSE = r"""
local tenant, resp = ARGV[2], ARGV[3]
local field = #tenant .. ':' .. tenant .. ':' .. resp
local function owner()
  local sid = redis.call('HGET', P .. 'resp', field)
  if sid and redis.call('HEXISTS', P .. 'o:' .. sid, resp) == 1 then return sid end
  if sid then
    redis.call('HDEL', P .. 'resp', field)
    redis.call('SREM', P .. 'rt:' .. resp, tenant)
  end
  return false
end
"""

# ARGV: 1 prefix, 2 tenant, 3 response id. Returns the response row or nil.
GET_RESPONSE = (
    _CLEAN
    + _RESPONSE
    + r"""
local sid = owner()
if not sid then return false end
return redis.call('HGET', P .. 'o:' .. sid, resp)
"""
)

# ARGV: 1 prefix, 2 tenant, 3 response id, 4 which end (1 head, 2 input head).
# Returns {session id, id, json, ...} root first, or {}.
RESPONSE_CHAIN = (
    _CLEAN
    + _RESPONSE
    + r"""
local sid = owner()
if not sid then return {} end
local ends = redis.call('HGET', P .. 'e:' .. sid, resp)
if not ends then return {} end
local head = string.match(ends, '^([^:]*)')
if ARGV[4] == '2' then head = string.match(ends, ':(.*)$') end
return (walk(sid, head, {sid}))  -- its first value only: the chain
"""
)

# ARGV: 1 prefix, 2 '', 3 response id. Returns 1 if any tenant has it.
RESPONSE_EXISTS = (
    _CLEAN
    + r"""
local resp = ARGV[3]
for _, tenant in ipairs(redis.call('SMEMBERS', P .. 'rt:' .. resp)) do
  local field = #tenant .. ':' .. tenant .. ':' .. resp
  local sid = redis.call('HGET', P .. 'resp', field)
  if sid and redis.call('HEXISTS', P .. 'o:' .. sid, resp) == 1 then return 1 end
  redis.call('HDEL', P .. 'resp', field)
  redis.call('SREM', P .. 'rt:' .. resp, tenant)
end
return 0
"""
)

# ARGV: 1 prefix, 2 tenant, 3 key. Returns the session's summaries' JSON (any order).
SUMMARIES = (
    _READ
    + r"""
local sid = live_sid(nm(ARGV[2], ARGV[3]))
if not sid then return {} end
return redis.call('HVALS', P .. 'm:' .. sid)
"""
)

# ARGV: 1 prefix, 2 tenant, 3 key, 4 limit, 5 before ('' for none), 6 k1, 7 b,
# 8 common share, 9 common min (proxy/store/bm25.py, SCRIPT_ARGS), 10... the
# stemmed words. Okapi BM25 as proxy/store/bm25.py's ``score`` computes it, the
# same operations in the same order, over the postings of those words only, and
# of those only the ones in at most the common share of the session's items (or
# the common min) when there are any, else the two rarest, as ``informative``
# chooses: a word in most items weighs next to nothing, and parsing its postings
# was most of a search at 5,000 stored turns. Returns {item id, position, score,
# content hash, ...}, best first, the newest of equals first.
SEARCH = (
    _READ
    + r"""
local sid = live_sid(nm(ARGV[2], ARGV[3]))
if not sid then return {} end
local stats = redis.call('HMGET', P .. 's:' .. sid, 'xn', 'xl')
local total = tonumber(stats[1] or '0')
if total == 0 then return {} end
local average = math.max(1, tonumber(stats[2]) / total)
local limit, before = tonumber(ARGV[4]), tonumber(ARGV[5])
local k1, b = tonumber(ARGV[6]), tonumber(ARGV[7])
local index = P .. 'x:' .. sid
local found, chosen = {}, {}
local cap = math.max(tonumber(ARGV[9]), tonumber(ARGV[8]) * total)
for i = 10, #ARGV do
  local posting = redis.call('HGET', index, ARGV[i])
  -- Its further chunks (proxy/store/redis_scripts.py, index_item).
  local chunks = tonumber(redis.call('HGET', index, ARGV[i] .. '#n') or '0')
  if chunks > 0 then
    local fields = {}
    for k = 1, chunks do fields[k] = ARGV[i] .. '#' .. k end
    local parts = {posting or ''}
    for _, part in ipairs(redis.call('HMGET', index, unpack(fields))) do
      if part then parts[#parts + 1] = part end
    end
    posting = table.concat(parts)
    if posting == '' then posting = nil end
  end
  if posting then
    local _, n = string.gsub(posting, ';', ';')
    found[#found + 1] = {n, ARGV[i], posting}
    if n <= cap then chosen[#chosen + 1] = found[#found] end
  end
end
if #chosen == 0 then
  table.sort(found, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  chosen = {found[1], found[2]}
end
local scores, positions, ranked = {}, {}, {}
for _, word in ipairs(chosen) do
  local n, posting = word[1], word[3]
  local idf = math.log(1 + (total - n + 0.5) / (n + 0.5))
  for id, tf, length, position in string.gmatch(posting, '(%d+),(%d+),(%d+),(%d+);') do
    if not before or tonumber(position) < before then
      local f, tokens = tonumber(tf), tonumber(length)
      if tokens == 0 then tokens = average end
      local norm = k1 * (1 - b + b * tokens / average)
      if not scores[id] then ranked[#ranked + 1] = id end
      scores[id] = (scores[id] or 0) + idf * f * (k1 + 1) / (f + norm)
      positions[id] = position
    end
  end
end
table.sort(ranked, function(x, y)
  if scores[x] ~= scores[y] then return scores[x] > scores[y] end
  return tonumber(x) > tonumber(y)
end)
local out = {}
local items = P .. 'i:' .. sid
for i = 1, math.min(limit, #ranked) do
  local id = ranked[i]
  out[#out + 1] = id
  out[#out + 1] = positions[id]
  out[#out + 1] = string.format('%.17g', scores[id])
  -- The item's content hash, its JSON's second field (both hashes are hex).
  local item = redis.call('HGET', items, id)
  out[#out + 1] = string.match(item, '^%["[^"]*","([^"]*)"') or cjson.decode(item)[2]
end
return out
"""
)
