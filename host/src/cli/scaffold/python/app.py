"""`{plugin}`: passes when the final answer equals the expected text, ignoring surrounding
white space. Replace `grade_trial` with your own logic.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log, types

SCHEMA = json.dumps({
    "type": "object",
    "additionalProperties": False,
    "properties": {"expected": {"type": "string"}},
})


def invalid_options(message: str) -> Err:
    """An error for bad options: the trial is "not graded", with this message."""
    return Err(types.PluginError(code=types.ErrorCode.INVALID_OPTIONS, message=message))


class Plugin(exports.Plugin):
    def info(self) -> types.PluginInfo:
        # Pure and fast: the host calls it to check and install the plugin, granting nothing.
        return types.PluginInfo(
            name="{plugin}",
            version="0.1.0",
            description="Exact match on the final answer",
            capabilities=[],
            options_schema=SCHEMA,
        )


class Grading(exports.Grading):
    def grade_trial(self, options: str, trial: types.Trial) -> types.Score:
        try:
            expected = json.loads(options).get("expected")
        except ValueError as e:
            raise invalid_options(f"options are not JSON: {e}")
        if expected is None and trial.case.expected is not None:
            expected = json.loads(trial.case.expected)
        if not isinstance(expected, str):
            raise invalid_options("set `expected`, or give the case an expected string")
        answer = (trial.trace.final_text or "").strip()
        if answer == expected.strip():
            value, reason = 1.0, "exact match"
        else:
            value, reason = 0.0, f"expected {expected!r}, got {answer!r}"
        log.log(log.Level.DEBUG, f"case {trial.case.id}: {reason}")
        return types.Score(value=value, pass_=None, reason=reason, details=None)
