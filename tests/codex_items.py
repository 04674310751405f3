"""Codex CLI's Responses request shapes, as its source serialises them (openai/codex,
codex-rs/protocol/src/models.rs ``ResponseItem``, and the tools its ``tools`` builder sends).

Codex sends ``store: false`` and its whole history every turn; it leaves ids off
the items it resends (``#[serde(skip_serializing)]`` on ``id``), keeps reasoning
as ``summary`` plus ``encrypted_content`` (``include: ["reasoning.encrypted_content"]``),
answers ``function_call`` (``exec_command``, namespaced MCP tools) with
``function_call_output`` and ``custom_tool_call`` (freeform ``apply_patch``) with
``custom_tool_call_output``, both by ``call_id``.
"""

from __future__ import annotations

from typing import Any

THREAD = "019a0c8e-6b7a-7d31-9f1e-3c2b1a0d9e8f"

EXEC_COMMAND = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a PTY, returning output or a session ID.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "cmd": {"type": "string", "description": "Shell command to execute."},
            "workdir": {"type": "string"},
            "yield_time_ms": {"type": "number"},
        },
        "required": ["cmd"],
        "additionalProperties": False,
    },
}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
        'end_patch: "*** End Patch" LF?\nhunk: add_hunk | delete_hunk | update_hunk\n',
    },
}
WEB_SEARCH = {"type": "web_search", "external_web_access": False}
NAMESPACE = {
    "type": "namespace",
    "name": "mcp__github__",
    "description": "Tools of the github MCP server.",
    "tools": [
        {
            "type": "function",
            "name": "search_issues",
            "description": "Search issues in a repository.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        }
    ],
}
TOOLS = [EXEC_COMMAND, APPLY_PATCH, WEB_SEARCH, NAMESPACE]


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def developer(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": text}],
    }


def assistant(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def reasoning(title: str, n: int) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": f"**{title}**\n\nLooking into it."}],
        "encrypted_content": f"gAAAAABo{n:04d}" + "Zm9vYmFy" * 24,
    }


def exec_call(call_id: str, cmd: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "name": "exec_command",
        "arguments": f'{{"cmd":"{cmd}","workdir":"/repo","yield_time_ms":10000}}',
        "call_id": call_id,
    }


def exec_output(call_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "function_call_output",
        "call_id": call_id,
        "output": "Chunk ID: 4f2a\nWall time: 0.0412 seconds\nProcess exited with code 0\n"
        f"Original token count: {len(text) // 4}\nOutput:\n{text}",
    }


def shell_call(call_id: str, command: str) -> dict[str, Any]:
    """The ``local_shell`` tool's call (codex-mini); Codex answers it with a
    ``function_call_output`` of the same ``call_id``."""
    return {
        "type": "local_shell_call",
        "call_id": call_id,
        "status": "completed",
        "action": {
            "type": "exec",
            "command": ["bash", "-lc", command],
            "timeout_ms": 10000,
            "working_directory": "/repo",
            "env": None,
            "user": None,
        },
    }


def namespaced_call(call_id: str, query: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "name": "search_issues",
        "namespace": "mcp__github__",
        "arguments": f'{{"query":"{query}"}}',
        "call_id": call_id,
    }


def image_output(call_id: str, text: str) -> dict[str, Any]:
    """A tool output as content items (an MCP tool's text and image): not a string."""
    return {
        "type": "function_call_output",
        "call_id": call_id,
        "output": [
            {"type": "input_text", "text": text},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
        ],
    }


def tool_search(call_id: str, query: str) -> list[dict[str, Any]]:
    """A client-run tool search and what it found (newer Codex, deferred MCP tools)."""
    return [
        {
            "type": "tool_search_call",
            "call_id": call_id,
            "status": "completed",
            "execution": "client",
            "arguments": {"query": query, "limit": 5},
        },
        {
            "type": "tool_search_output",
            "call_id": call_id,
            "status": "completed",
            "execution": "client",
            "tools": [NAMESPACE],
        },
    ]


def patch_call(call_id: str, path: str) -> dict[str, Any]:
    return {
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": call_id,
        "name": "apply_patch",
        "input": f"*** Begin Patch\n*** Update File: {path}\n@@\n-old = 1\n+new = 2\n"
        "*** End Patch\n",
    }


def patch_output(call_id: str, path: str) -> dict[str, Any]:
    return {
        "type": "custom_tool_call_output",
        "call_id": call_id,
        "output": f"Success. Updated the following files:\nM {path}\n",
    }


def web_search(query: str) -> dict[str, Any]:
    return {
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": query},
    }


def unknown(n: int) -> dict[str, Any]:
    """An item type no API version knows yet: forwarded as it came."""
    return {"type": "future_item", "payload": {"n": n, "note": "from a newer client"}}


def listing(turn: int, fact: str | None = None, lines: int = 60) -> str:
    """A long command output (a file listing), with ``fact`` in it when given."""
    rows = [f"src/module_{turn}_{i}.py    {100 + i * 7} lines" for i in range(lines)]
    if fact is not None:
        rows.insert(lines // 2, fact)
    return "\n".join(rows)


def turn(t: int, fact: str | None = None, lines: int = 60) -> list[dict[str, Any]]:
    """One Codex turn: the user's ask, then reasoning before each call, every call kind
    with its output, a web search, an unknown item, and the closing answer."""
    return [
        user(f"Turn {t}: look at the files of module {t} and fix what is broken."),
        reasoning(f"Listing module {t}", 10 * t),
        exec_call(f"call_exec_{t}", f"ls -la src/module_{t}"),
        exec_output(f"call_exec_{t}", listing(t, fact, lines)),
        reasoning(f"Searching issues {t}", 10 * t + 1),
        namespaced_call(f"call_mcp_{t}", f"module {t} crash"),
        {
            "type": "function_call_output",
            "call_id": f"call_mcp_{t}",
            "output": f"#{400 + t}: module {t} crashes on start",
        },
        reasoning(f"Patching module {t}", 10 * t + 2),
        patch_call(f"call_patch_{t}", f"src/module_{t}.py"),
        patch_output(f"call_patch_{t}", f"src/module_{t}.py"),
        web_search(f"python module {t} best practice"),
        unknown(t),
        reasoning(f"Summing up {t}", 10 * t + 3),
        assistant(f"Module {t} is fixed: the start-up crash came from a stale import."),
    ]


def body(items: list[dict[str, Any]], *, stream: bool = False) -> dict[str, Any]:
    """A Codex request body around ``items``."""
    return {
        "model": "gpt-5.1-codex",
        "instructions": "You are Codex, a coding agent based on GPT-5.",
        "input": items,
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": stream,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": THREAD,
        "client_metadata": {"x-codex-installation-id": "5a1c0e7e-inst"},
    }


def headers(window: int = 0) -> dict[str, str]:
    return {
        "session-id": THREAD,
        "thread-id": THREAD,
        "x-codex-window-id": f"{THREAD}:{window}",
        "originator": "codex_exec",
    }


# Each output kind and the call kinds it answers.
PAIRED = {
    "function_call_output": ("function_call", "local_shell_call"),
    "custom_tool_call_output": ("custom_tool_call",),
}


def pairing_problems(items: list[dict[str, Any]]) -> list[str]:
    """Calls without their output and outputs without their call, by call_id."""
    problems: list[str] = []
    for output_kind, call_kinds in PAIRED.items():
        calls = [i.get("call_id") for i in items if i.get("type") in call_kinds]
        outputs = [i.get("call_id") for i in items if i.get("type") == output_kind]
        if sorted(map(str, calls)) != sorted(map(str, outputs)):
            problems.append(f"{output_kind}: calls {calls} vs outputs {outputs}")
    return problems
