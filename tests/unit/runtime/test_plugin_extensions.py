"""Installed packages contribute hook and interceptor classes (entry points); a version's policy names them by kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import plugins
from runtime.config import PolicyError, build_runtime, check_policy, parse_policy
from runtime.loop import AgentConfig
from runtime.plugins import BUILTIN, ContributedHook, ExtensionError, Role
from runtime.scripted import call, say
from runtime.types import TerminalReason
from tests.support import extension_dist
from tests.unit.runtime.helpers import MODEL, harness

REDACT = {"kind": "fx.redact", "config": {"secret": "CA1234"}}


@pytest.fixture
def fx_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = extension_dist.install(tmp_path, monkeypatch)
    yield root
    extension_dist.cleanup()


def test_a_contributed_model_interceptor_changes_the_model_request_in_a_real_run(fx_dist: Path) -> None:
    # given a version whose policy names the installed package's model interceptor
    h = harness([say("on time")], policy={"interceptors": {"model": [REDACT]}})

    # when the loop runs
    result = h.run()

    # then the interceptor saw the request and the model got the changed one; the conversation is unchanged
    assert result.terminal_reason == TerminalReason.FINAL_ANSWER
    sent = h.model.requests[0].messages
    assert "[redacted]" in sent[1]["content"] and "CA1234" not in json.dumps(sent)
    assert any("CA1234" in str(c) for c in sys.modules["agentops_fx_ext"].Redact.seen[-1])
    assert "CA1234" in h.messages()[1]["content"]


def test_a_contributed_hook_fires_under_its_policy_name(fx_dist: Path) -> None:
    policy = {"hooks": [{"name": "tagger", "kind": "fx.tag", "config": {"key": "channel", "value": "web"}}]}
    h = harness([say("hello")], policy=policy)

    h.run()

    assert h.state()["channel"] == "web"
    decisions = [d for d in h.events("hook.decision") if d["payload"]["hook"] == "tagger"]
    assert [d["payload"]["position"] for d in decisions] == ["before_agent"]
    assert decisions[0]["payload"]["reason"] == "tagged by a plugin"


def test_a_contributed_tool_interceptor_wraps_every_tool_call(fx_dist: Path) -> None:
    policy = {"interceptors": {"tool": [{"kind": "fx.suffix", "config": {"suffix": " [via plugin]"}}]}}
    h = harness([call("lookup", {"q": "CA1234"}), say("done")], policy=policy)

    h.run()

    tool_messages = [m for m in h.messages() if m["role"] == "tool"]
    assert tool_messages and tool_messages[0]["content"].endswith(" [via plugin]")


def test_built_in_and_contributed_kinds_share_one_table(fx_dist: Path) -> None:
    table = plugins.default_registry()
    assert table.kinds(Role.HOOK) == ["fx.tag", "set_state", "stop_when"]
    assert table.kinds(Role.MODEL_INTERCEPTOR) == ["fx.other", "fx.redact"]
    assert table.kinds(Role.TOOL_INTERCEPTOR) == ["fx.suffix"]
    set_state = table.get(Role.HOOK, "set_state")
    assert set_state is not None and set_state.source == BUILTIN and set_state.group == "agentops.hooks"
    redact = table.get(Role.MODEL_INTERCEPTOR, "fx.redact")
    assert redact is not None and redact.available
    assert (redact.source, redact.target, redact.group) == ("agentops-fx-ext 1.0", "agentops_fx_ext:Redact", "agentops.model_interceptors")
    assert redact.schema is not None and redact.schema["required"] == ["secret"]
    # the built-in kinds still work through the same lookup
    h = harness([say("x")], policy={"hooks": [{"name": "flag", "kind": "set_state", "position": "before_agent", "values": {"vip": True}}]})
    h.run()
    assert h.state()["vip"] is True


def test_an_unknown_kind_is_refused_with_its_path_and_the_available_kinds(fx_dist: Path) -> None:
    # an importable module that no entry point names: a tenant's policy must not be able to load it
    (fx_dist / "agentops_fx_unlisted.py").write_text("class Thing:\n    pass\n")
    path_kind = "agentops_fx_unlisted:Thing"
    policy = {"hooks": [{"name": "x", "kind": "fx.nope"}],
              "interceptors": {"model": [REDACT, {"kind": path_kind}, {"kind": "agentops_fx_unlisted.Thing"}], "tool": [{}]}}
    with pytest.raises(PolicyError) as info:
        parse_policy(policy)
    errors = info.value.errors
    assert "hooks[0].kind: unknown hook kind 'fx.nope'; expected one of ['fx.tag', 'set_state', 'stop_when']" in errors
    assert f"interceptors.model[1].kind: unknown model interceptor kind {path_kind!r}; expected one of ['fx.other', 'fx.redact']" in errors
    assert any(e.startswith("interceptors.model[2].kind: unknown model interceptor kind") for e in errors)
    assert "interceptors.tool[0].kind: unknown tool interceptor kind None; expected one of ['fx.suffix']" in errors
    assert "agentops_fx_unlisted" not in sys.modules, "a kind from a policy is looked up in the table, never imported"


def test_config_that_does_not_match_the_schema_is_refused_with_its_path(fx_dist: Path) -> None:
    policy = {
        "hooks": [{"name": "t", "kind": "fx.tag", "config": {"key": "k"}, "position": "before_model"}],
        "interceptors": {
            "model": [{"kind": "fx.redact", "config": {"secret": 5, "extra": 1}}],
            "tool": [{"kind": "fx.suffix", "config": {"max_chars": "many"}}, {"kind": "fx.suffix", "config": []}],
        },
    }
    errors = check_policy(policy)
    assert "hooks[0].config.value: Field required" in errors
    assert any(e.startswith("hooks[0].position: unknown field; expected one of ['name', 'kind', 'config']") for e in errors)
    assert "interceptors.model[0].config.secret: Input should be a valid string, got 5" in errors
    assert "interceptors.model[0].config.extra: Extra inputs are not permitted, got 1" in errors
    assert any(e.startswith("interceptors.tool[0].config.max_chars: Input should be a valid integer") for e in errors), errors
    assert "interceptors.tool[1].config: must be an object, got list" in errors
    # the document shape itself is checked too
    assert check_policy({"interceptors": {"modle": []}}) == ["interceptors.modle: unknown field; expected one of ['model', 'tool']"]
    assert check_policy({"interceptors": {"model": {}}}) == ["interceptors.model: must be a list of model interceptor objects, got dict"]


def test_broken_entry_points_are_listed_unavailable_and_nothing_crashes(fx_dist: Path) -> None:
    table = plugins.discover()  # never raises

    reasons = {ext.kind: ext.reason for ext in table.unavailable()}
    assert reasons["fx.missing"].startswith("could not be imported: ModuleNotFoundError")
    assert reasons["fx.boom"] == "could not be imported: RuntimeError: boom at import"
    assert "must be callable as (request, call_next)" in reasons["fx.not_callable"]
    assert "must be a class, got function" in reasons["fx.function"]
    assert "must declare positions" in reasons["fx.no_positions"]
    assert "namespaced in lower case" in reasons["Bad-Name"]
    described = {row["kind"]: row for row in (ext.describe() for ext in table)}
    assert described["fx.boom"]["available"] is False and described["fx.boom"]["source"] == "agentops-fx-ext 1.0"
    assert described["fx.redact"]["available"] is True
    # a version naming a broken one is refused, and the working ones still run
    errors = check_policy({"interceptors": {"model": [{"kind": "fx.boom"}]}}, extensions=table)
    assert errors == ["interceptors.model[0].kind: not available on this platform: model interceptor kind 'fx.boom'; "
                      "expected one of ['fx.other', 'fx.redact']"]
    assert harness([say("ok")], policy={"interceptors": {"model": [REDACT]}}).run().output == "ok"


def test_the_same_kind_from_two_distributions_is_unavailable(fx_dist: Path) -> None:
    extension_dist.write_dist(fx_dist, "agentops-fx-dup", "[agentops.hooks]\nfx.tag = agentops_fx_ext:Tag\n", version="2.0")
    table = plugins.discover()
    tag = table.get(Role.HOOK, "fx.tag")
    assert tag is not None and not tag.available
    assert "more than one distribution (agentops-fx-dup 2.0, agentops-fx-ext 1.0)" in tag.reason


def test_the_allow_list_restricts_contributed_kinds_and_never_imports_the_others(fx_dist: Path) -> None:
    table = plugins.discover(allowed=["fx.redact", "fx.s*"])

    assert table.kinds(Role.MODEL_INTERCEPTOR) == ["fx.redact"]
    assert table.kinds(Role.TOOL_INTERCEPTOR) == ["fx.suffix"]
    assert table.kinds(Role.HOOK) == ["set_state", "stop_when"], "built-in kinds are always allowed"
    other = table.get(Role.MODEL_INTERCEPTOR, "fx.other")
    assert other is not None and other.reason == "not in the platform's allow-list of extensions"
    assert "agentops_fx_other" not in sys.modules and "agentops_fx_boom" not in sys.modules
    # and the process-wide table follows configure()
    try:
        plugins.configure(allowed=["fx.redact"])
        assert plugins.default_registry().kinds(Role.TOOL_INTERCEPTOR) == []
    finally:
        plugins.configure(allowed=None)


def test_a_contributed_hook_is_built_under_its_name_and_a_failing_constructor_is_a_clear_error(fx_dist: Path) -> None:
    policy = parse_policy({"hooks": [{"name": "tagger", "kind": "fx.tag", "config": {"key": "a", "value": "b"}}]})
    runtime = build_runtime(policy, AgentConfig(MODEL, "sys"))
    contributed = [h for h in runtime.hooks if isinstance(h, ContributedHook)]
    assert [(h.name, h.kind) for h in contributed] == [("tagger", "fx.tag")]

    # a version saved while the extension was installed, run after it was removed
    extension_dist.cleanup()
    empty = plugins.ExtensionRegistry(plugins.builtin_extensions())
    with pytest.raises(ExtensionError, match=r"hooks\[0\]: hook kind 'fx.tag' is not available"):
        build_runtime(policy, AgentConfig(MODEL, "sys"), extensions=empty)


def test_the_runtime_still_imports_no_django() -> None:
    # a fresh interpreter without Django settings: import every runtime module and build a policy with the table
    code = (
        "import pkgutil, importlib, sys\n"
        "import runtime\n"
        "for m in pkgutil.walk_packages(runtime.__path__, 'runtime.'):\n"
        "    importlib.import_module(m.name)\n"
        "from runtime.plugins import default_registry\n"
        "from runtime.config import parse_policy\n"
        "default_registry(); parse_policy({'interceptors': {'model': [], 'tool': []}})\n"
        "print(sorted(n for n in sys.modules if n == 'django' or n.startswith('django.')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env=env, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
