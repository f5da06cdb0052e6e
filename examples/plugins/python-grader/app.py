"""`example/grader/answer-py`: an mst grader written in Python.

Passes when the final answer contains the expected text, and signs each verdict: the reason
ends with `signature HEX`, HMAC-SHA256 of `CASE:VARIANT:TRIAL:SCORE` (the score as `1.0` or
`0.0`) keyed by the granted secret `EXAMPLE_SIGNING_KEY`, so whoever holds the key can tell a
verdict this grader gave from one edited in the results afterwards. Each verdict is also
written to the host's log.

Built by `cargo xtask plugins` into plugins/dist/examples/answer-py.wasm; by hand, here:
    componentize-py -d ../../../wit -w grader componentize app -o answer-py.wasm
"""

import hashlib
import hmac
import json

# componentize-py bundles only the modules imported while it builds the component, and `hmac`
# imports `warnings` only when called: import it here, or the call fails in the sandbox.
import warnings  # noqa: F401

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log, secrets, types

SECRET = "EXAMPLE_SIGNING_KEY"

SCHEMA = json.dumps({
    "type": "object",
    "additionalProperties": False,
    "properties": {"expected": {"type": "string"}},
})


def error(code: types.ErrorCode, message: str) -> Err:
    """A plugin error: the trial is "not graded", with this message."""
    return Err(types.PluginError(code=code, message=message))


class Plugin(exports.Plugin):
    def info(self) -> types.PluginInfo:
        # Pure: the host calls it with nothing granted.
        return types.PluginInfo(
            name="example/grader/answer-py",
            version="0.1.0",
            description="Expected text present; verdicts signed with EXAMPLE_SIGNING_KEY (Python)",
            capabilities=[types.Capability_Secret(SECRET)],
            options_schema=SCHEMA,
        )


class Grading(exports.Grading):
    def grade_trial(self, options: str, trial: types.Trial) -> types.Score:
        try:
            expected = json.loads(options).get("expected")
        except ValueError as e:
            raise error(types.ErrorCode.INVALID_OPTIONS, f"options are not JSON: {e}")
        if expected is None and trial.case.expected is not None:
            expected = json.loads(trial.case.expected)
        if not isinstance(expected, str):
            raise error(
                types.ErrorCode.INVALID_OPTIONS,
                "set the option `expected`, or give the case an `expected` string",
            )
        answer = trial.trace.final_text or ""
        if expected in answer:
            value, reason = 1.0, f"the answer contains {expected!r}"
        else:
            value, reason = 0.0, f"the answer lacks {expected!r}"
        # An error (not granted, not set) propagates: the trial is not graded.
        key = secrets.get(SECRET).encode()
        message = f"{trial.case.id}:{trial.variant}:{trial.trial}:{value}".encode()
        signature = hmac.new(key, message, hashlib.sha256).hexdigest()
        log.log(log.Level.INFO, f"case {trial.case.id}: {value} ({reason})")
        return types.Score(
            value=value, pass_=None, reason=f"{reason}; signature {signature}", details=None
        )
