"""How schema8.sqlite was made: by the SQLite store at schema version 8 (commit b46fc58).

    PYTHONPATH=<a checkout of b46fc58> python tests/store/data/make_schema8.py schema8.sqlite

Chat turns (an incomplete reply, a tool call, a named message), a Responses
API chain (items whose role column is their type), a summary, two vectors, and
a session deleted last (so the AUTOINCREMENT counter, 15, is above every id
kept, 13). tests/store/test_migration_items.py migrates a copy of it.
"""
import asyncio, sys, os
from pathlib import Path
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
from proxy.store.sqlite import SqliteStore
from proxy.store.sqlite_vectors import SqliteVectorIndex
from proxy.store.vectors import ItemVector
from proxy.store.base import SessionRef, MessageIn, RequestRecord, ResponseIn, SummaryIn
from proxy.http.sessions import content_hash
from proxy.responses.items import item_role

def m(role, text, **kw):
    d = {"role": role, "content": text, **kw}
    return MessageIn(d, content_hash(d), role, len(text) // 4 + 3)

def req(i, key, tenant="t1"):
    return RequestRecord(id=f"req-{i}", tenant=tenant, route="routes[0]", policy="trim", model="gpt-4o",
                         stream=False, status=200, session_key=key, messages_before=3, dropped_indexes=[1])

async def main(path):
    store = SqliteStore(path); await store.open()
    alice, bob, gone = SessionRef("t1", "alice"), SessionRef("t2", "bob"), SessionRef("t1", "gone")
    hist = [m("system", "You are terse."), m("user", "Where is the Eiffel tower? In Lyon?")]
    await store.record_exchange(alice, hist, m("assistant", "No: in Paris."), req(1, "alice"))
    hist += [m("assistant", "No: in Paris."), m("user", "And the Louvre?")]
    cut = {"role": "assistant", "content": "Also in Par"}
    await store.record_exchange(alice, hist, MessageIn(cut, content_hash(cut), "assistant", 4, "incomplete"), req(2, "alice"))
    # a tool call and a message with a name
    tools = [m("user", "weather?", name="carol"),
             MessageIn({"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]}, "x" * 32, "assistant", 12)]
    tools[1] = MessageIn(tools[1].message, content_hash(tools[1].message), "assistant", 12)
    tool = {"role": "tool", "tool_call_id": "c1", "content": "rain"}
    await store.record_exchange(bob, tools + [MessageIn(tool, content_hash(tool), "tool", 3)], m("assistant", "It rains in Oslo."), req(3, "bob", "t2"))
    # Responses API items: no role (role column = their type)
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Plan a trip"}]},
             {"type": "function_call", "call_id": "f1", "name": "search", "arguments": "{\"q\": \"Rome\"}"},
             {"type": "function_call_output", "call_id": "f1", "output": "Rome: sunny"}]
    ins = [MessageIn(i, content_hash(i), item_role(i), 10) for i in items]
    out = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Go to Rome."}]}]
    outs = [MessageIn(i, content_hash(i), item_role(i), 5) for i in out]
    carol = SessionRef("t1", "resp:resp_1")
    await store.record_response(carol, ins, outs, ResponseIn("resp_1", {"id": "resp_1", "output": out}, "completed", "gpt-4o"), req(5, "resp:resp_1"))
    # a summary over alice's first turns
    await store.save_summary(alice, hist[:3], SummaryIn("The tower is in Paris.", facts=({"kind": "place", "value": "Paris"},), model="m"))
    # vectors for two of alice's items
    chain = await store.history(alice)
    vi = SqliteVectorIndex(store.fetch, store.write)
    await vi.put_vectors(alice, [ItemVector(chain[1].id, 1, chain[1].content_hash, b"\x01\x02" * 4), ItemVector(chain[2].id, 2, chain[2].content_hash, b"\x03\x04" * 4)])
    # a session deleted: its ids (above every kept one) must never come back
    await store.record_exchange(gone, [m("user", "temporary")], m("assistant", "ok"), req(4, "gone"))
    await store.delete_session(gone)
    await store.close()
    import sqlite3
    c = sqlite3.connect(path)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    print(c.execute("select max(version) from schema_migrations").fetchone(), c.execute("select * from sqlite_sequence").fetchall(),
          c.execute("select count(*) from items").fetchone(), c.execute("select id, role, status from items").fetchall())
    c.execute("PRAGMA journal_mode=DELETE"); c.execute("VACUUM"); c.close()
asyncio.run(main(sys.argv[1]))
