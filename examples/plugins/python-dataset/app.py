"""`example/dataset/csv-py`: an mst dataset resolver written in Python.

Reads a CSV file with a header row: `id` and `input` columns, and optionally `expected` and
`tags` (separated by `;`). Every value is text. Options: `path` (the host reads the file and
passes its bytes), `type`, and `delimiter` (one character, default `,`).

Built by `cargo xtask plugins` into plugins/dist/examples/csv-py.wasm; by hand, here:
    componentize-py -d ../../../wit -w dataset componentize app -o csv-py.wasm
"""

import csv
import io
import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log, types

SCHEMA = json.dumps({
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "type": {"type": "string"},
        "path": {"type": "string"},
        "delimiter": {"type": "string", "minLength": 1, "maxLength": 1},
    },
})


def invalid(message: str) -> Err:
    """An error about the file: the host names the dataset entry before it."""
    return Err(types.PluginError(code=types.ErrorCode.INVALID_INPUT, message=message))


class Plugin(exports.Plugin):
    def info(self) -> types.PluginInfo:
        return types.PluginInfo(
            name="example/dataset/csv-py",
            version="0.1.0",
            description="Cases from a CSV file with a header row (Python)",
            capabilities=[],
            options_schema=SCHEMA,
        )


class Datasets(exports.Datasets):
    def resolve(self, options: str, content: bytes | None) -> list[types.Case]:
        delimiter = json.loads(options).get("delimiter", ",")
        if content is None:
            raise invalid("no file: give the dataset entry a `path` to a CSV file")
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as e:
            raise invalid(f"the file is not UTF-8: {e}")
        reader = csv.DictReader(io.StringIO(text), delimiter=delimiter)
        missing = {"id", "input"} - set(reader.fieldnames or [])
        if missing:
            raise invalid(f"the header row lacks {', '.join(sorted(missing))}")
        cases, seen = [], set()
        # Line 1 is the header.
        for line, row in enumerate(reader, start=2):
            case_id = (row.get("id") or "").strip()
            if not case_id or case_id in seen:
                raise invalid(f"line {line}: `id` is empty or repeats an earlier one")
            seen.add(case_id)
            expected = row.get("expected")
            tags = [t.strip() for t in (row.get("tags") or "").split(";") if t.strip()]
            cases.append(types.Case(
                id=case_id,
                input=json.dumps(row["input"]),
                expected=json.dumps(expected) if expected else None,
                tags=tags,
                metadata=None,
            ))
        log.log(log.Level.INFO, f"read {len(cases)} cases")
        return cases
