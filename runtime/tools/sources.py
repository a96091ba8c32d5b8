"""The built-in tools, in their fixed source order (seed 001 §3): core (read, write, edit,
apply_patch), runtime (exec, process), messaging (message), memory (memory_search,
memory_get, memory_write), automation (cron), sessions (sessions_*, session_status),
channel tools (react, pin, thread_create — only in turns from their platforms), then
plugin tools, which register at run time through
``ToolRegistry.register_plugin("mcp:<server>", tools)``.

Each tool is declared here (name, description, JSON schema, source, policy group, side
effects): that is all the registry, the policy and the model need. Its handler lives in
its own module (runtime/tools/fs.py, exec.py, patch.py, memory_tool.py, ...), imported by
the tool's first call (issue 9, cold start: a gateway does not load tool code it has not
run).
"""

from __future__ import annotations

from runtime.tools.process import PROCESS_TOOL
from runtime.tools.registry import Handler, Tool, ToolRegistry, deferred, object_schema


def _h(target: str) -> Handler:
    """The handler ``function`` of ``runtime.tools.<module>``, for ``"module:function"``."""
    return deferred(f"runtime.tools.{target}")


_S = {"type": "string"}

FS_TOOLS = [
    Tool("read", "Read a text file (or list a directory) in the workspace. Optional offset "
         "(1-based line) and limit (lines).",
         object_schema({"path": {"type": "string"}, "offset": {"type": "integer"},
                        "limit": {"type": "integer"}}, ["path"]), _h("fs:read_tool"),
         source="core", group="group:fs"),
    Tool("write", "Create or overwrite a file in the workspace with the given content.",
         object_schema({"path": {"type": "string"}, "content": {"type": "string"}},
                       ["path", "content"]), _h("fs:write_tool"),
         source="core", group="group:fs", side_effects=True),
    Tool("edit", "Replace one exact occurrence of old_text with new_text in a workspace file.",
         object_schema({"path": {"type": "string"}, "old_text": {"type": "string"},
                        "new_text": {"type": "string"}}, ["path", "old_text", "new_text"]),
         _h("fs:edit_tool"), source="core", group="group:fs", side_effects=True),
]

APPLY_PATCH_TOOL = Tool(
    "apply_patch",
    "Apply a unified diff (--- a/path, +++ b/path, @@ hunks; /dev/null to create or "
    "delete) to workspace files. All hunks must match or nothing is changed.",
    object_schema({"patch": {"type": "string", "description": "the unified diff"}},
                  ["patch"]),
    _h("patch:apply_patch_tool"), source="core", group="group:fs", side_effects=True,
)

EXEC_TOOL = Tool(
    "exec",
    "Run a shell command in the workspace. Returns exit code and output. Set background: "
    "true for long commands: you get a system event when they finish.",
    object_schema({"command": {"type": "string"},
                   "timeout": {"type": "number", "description": "seconds"},
                   "background": {"type": "boolean"}}, ["command"]),
    _h("exec:exec_tool"), source="runtime", group="group:runtime", side_effects=True,
)

MESSAGE_TOOL = Tool(
    "message",
    "Send a message and/or files. With channel and to (e.g. 'telegram', '42'; an account "
    "as 'telegram:work'; a thread as to '42:7') it reaches another chat; without them it "
    "goes to this conversation (your reply is delivered anyway: use it for files or extra "
    "messages). media: workspace paths or https URLs, "
    "sent as native photos, voice notes (.ogg) or documents. In a reply, a line "
    "'MEDIA: <path>' attaches a file too.",
    object_schema({"channel": {"type": "string"}, "to": {"type": "string"},
                   "text": {"type": "string"},
                   "media": {"type": "array", "items": {"type": "string"}}}, []),
    _h("message:message_tool"), source="messaging", group="group:messaging",
    side_effects=True,
)

MEMORY_TOOL = Tool(
    "memory_search",
    (
        "Search your memory: long-term notes (MEMORY.md), daily notes "
        "(memory/YYYY-MM-DD.md) and what you remembered for the person you are talking "
        "to (and this group), paragraph by paragraph, by keywords (and by meaning when "
        "semantic search is configured). Recent notes can rank higher. Use "
        "created_after/created_before to limit the search to a time window. Returns "
        "matching paragraphs with file path, line, scope, score parts and when they were "
        "written."
    ),
    {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Keywords to look for."},
            "created_after": {
                "type": "string",
                "description": "Only notes written at or after this time: RFC 3339 "
                               "(2026-01-02T10:00:00Z) or a date (2026-01-02, user's timezone).",
            },
            "created_before": {
                "type": "string",
                "description": "Only notes written before this time (same formats).",
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": 20,
                      "description": "How many paragraphs to return (default 5)."},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    _h("memory_tool:memory_search"), source="memory", group="group:memory",
)

MEMORY_GET_TOOL = Tool(
    "memory_get",
    "Read lines of a memory file (MEMORY.md or memory/YYYY-MM-DD.md), e.g. around a "
    "memory_search hit. from_line is 1-based; lines defaults to 40.",
    object_schema({"path": {"type": "string"}, "from_line": {"type": "integer"},
                   "lines": {"type": "integer"}}, ["path"]),
    _h("memory_tool:memory_get"), source="memory", group="group:memory")

MEMORY_WRITE_TOOL = Tool(
    "memory_write",
    "Remember something. In a chat with a person it is remembered for that person "
    "(scope 'user', the default there; only they see it) or, when allowed, for the whole "
    "group (scope 'group'). The shared agent memory (scope 'agent': target 'daily' "
    "appends to today's memory/YYYY-MM-DD.md, 'long_term' to MEMORY.md) is written only "
    "by the agent's owners. Write one self-contained paragraph.",
    object_schema({"text": {"type": "string"},
                   "target": {"type": "string", "enum": ["daily", "long_term"]},
                   "scope": {"type": "string", "enum": ["user", "group", "agent"]}},
                  ["text"]),
    _h("memory_tool:memory_write"), source="memory", group="group:memory", side_effects=True)

MEMORY_TOOLS = [MEMORY_TOOL, MEMORY_GET_TOOL, MEMORY_WRITE_TOOL]

CRON_TOOL = Tool(
    "cron",
    "Manage your scheduled jobs. action 'add' needs message and one of cron ('0 9 * * 1-5', "
    "optional tz), every ('30m') or at ('2026-03-01T09:00:00+01:00' or '20m'); session "
    "'main' (default: the message reaches you in your main session) or 'isolated' (a "
    "separate run whose reply goes back to this chat, or to deliver: '<channel>:<to>' or "
    "'none'). 'list' shows "
    "your jobs; 'remove' needs id.",
    object_schema({
        "action": {"type": "string", "enum": ["add", "list", "remove"]},
        "name": _S, "cron": _S, "tz": _S, "every": _S, "at": _S, "message": _S,
        "session": {"type": "string", "enum": ["main", "isolated"]},
        "deliver": _S, "id": _S,
    }, ["action"]),
    _h("cron_tool:cron_tool"), source="automation", group="group:automation",
    side_effects=True,
)

_SESSIONS = {"source": "sessions", "group": "group:sessions"}

SESSIONS_TOOLS = [
    Tool("sessions_list", "List sessions (key, channel, last activity) you may see.",
         object_schema({"limit": {"type": "integer"}}, []),
         _h("sessions:sessions_list"), **_SESSIONS),
    Tool("sessions_history", "The recent messages of a session (tool results shortened).",
         object_schema({"key": _S, "limit": {"type": "integer"}}, ["key"]),
         _h("sessions:sessions_history"), **_SESSIONS),
    Tool("sessions_send", "Send a message to another session (agent-to-agent): runs a turn "
         "there and returns its reply.", object_schema({"key": _S, "text": _S},
                                                      ["key", "text"]),
         _h("sessions:sessions_send"), side_effects=True, **_SESSIONS),
    Tool("sessions_spawn", "Start a subagent on a task in its own session; returns at once "
         "with a run id and the result is announced to you later. cleanup: keep|delete.",
         object_schema({"task": _S, "label": _S, "agent": _S, "model": _S,
                        "cleanup": {"type": "string", "enum": ["keep", "delete"]},
                        "timeout": {"type": "number", "description": "seconds"}}, ["task"]),
         _h("sessions:sessions_spawn"), side_effects=True, **_SESSIONS),
    Tool("session_status", "Status of this session (or of key): ids, times, turns, tokens, "
         "model, subagent runs.", object_schema({"key": _S}, []),
         _h("sessions:session_status"), **_SESSIONS),
]

CHAT_PLATFORMS = frozenset({"slack", "discord", "telegram"})
"""The platforms whose turns get the react and pin tools."""

_CHANNEL = {"source": "channel", "group": "group:channel", "side_effects": True}

CHANNEL_TOOLS = [
    Tool("react", "React to a message in this chat with an emoji (default: the message you "
         "are answering).", object_schema({"emoji": _S, "message_id": _S}, ["emoji"]),
         _h("channel:react_tool"), platforms=CHAT_PLATFORMS, **_CHANNEL),
    Tool("pin", "Pin a message in this chat (default: the message you are answering).",
         object_schema({"message_id": _S}, []), _h("channel:pin_tool"),
         platforms=CHAT_PLATFORMS, **_CHANNEL),
    Tool("thread_create", "Start a Discord thread in this channel (from message_id if "
         "given).", object_schema({"name": _S, "message_id": _S}, ["name"]),
         _h("channel:thread_create_tool"), platforms=frozenset({"discord"}), **_CHANNEL),
]


def builtin_tools() -> list[Tool]:
    """Every built-in tool, in source order."""
    return [*FS_TOOLS, APPLY_PATCH_TOOL, EXEC_TOOL, PROCESS_TOOL, MESSAGE_TOOL,
            *MEMORY_TOOLS, CRON_TOOL, *SESSIONS_TOOLS, *CHANNEL_TOOLS]


def builtin_registry() -> ToolRegistry:
    """A registry holding the built-in tools (plugin tools are added later)."""
    return ToolRegistry(builtin_tools())
