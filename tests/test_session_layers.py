"""The realtime session's layers, checked on every import (as ``tests/test_layering.py`` checks
the packages', with its reader; imports under ``if TYPE_CHECKING:`` count too).

- The turn-taking core (``serving/realtime/turn_taking.py``) is pure: it imports no event loop
  and nothing of the session it decides for.
- The session's parts come in one order (``PARTS``) and none imports a part after it, the
  shell last: each part is handed what it calls. Before, the session's parts were mixins of one
  class whose ``core`` declared what the others implement, and ``core`` <-> ``live`` <->
  ``preempt`` imported each other for their types: that circle cannot come back.
"""

from __future__ import annotations

from tests.test_layering import Rule, _package, _resolved, uses_of

SESSION = "omnictl.serving.realtime.session"
CORE = "omnictl.serving.realtime.turn_taking"
PARTS = ("settings", "milestones", "context", "listening", "transcripts", "replies", "items", "configure", "shell")

RULES = (
    Rule(CORE, "asyncio", "the turn-taking core is pure: no event loop", types=True),
    Rule(CORE, SESSION, "the turn-taking core knows nothing of the session that feeds it", types=True),
    *(
        Rule(f"{SESSION}.{part}", f"{SESSION}.{later}", f"the session's part {part} is handed what it calls, "
             f"never imports {later} (the parts come in the order {', '.join(PARTS)})", types=True)
        for i, part in enumerate(PARTS)
        for later in PARTS[i + 1:]
    ),
    *(
        Rule(f"{SESSION}.{part}", SESSION, "a part never imports the session package (which is the shell)", types=True)
        for part in PARTS
    ),
)


def broken(rules: tuple[Rule, ...]) -> list[str]:
    files, modules = _package()
    problems = []
    for path, this in files:
        for use in uses_of(path, this):
            target = _resolved(use.target, modules)
            for rule in rules:
                within = target == rule.forbidden or target.startswith(rule.forbidden + ".")
                source = this == rule.source or this.startswith(rule.source + ".")
                # the package itself (its __init__, the shell's door) is the one the parts must not import
                if rule.forbidden == SESSION and target != SESSION:
                    within = False
                if source and within and this != target:
                    problems.append(f"{path.name}:{use.line}: {this} imports {target} ({rule.why})")
    return problems


def test_the_session_s_parts_import_in_one_direction_and_the_core_is_pure() -> None:
    problems = broken(RULES)
    assert not problems, "\n".join(problems)


def test_every_part_named_exists() -> None:
    _, modules = _package()
    assert {f"{SESSION}.{part}" for part in PARTS} <= modules and CORE in modules


def test_the_rules_catch_the_circle_that_was() -> None:
    """``core`` importing ``live`` for a type, as it did: the rule names it."""
    rule = Rule(f"{SESSION}.context", f"{SESSION}.transcripts", "order", types=True)
    assert rule.applies(f"{SESSION}.context", f"{SESSION}.transcripts")
    assert not rule.applies(f"{SESSION}.transcripts", f"{SESSION}.context")
