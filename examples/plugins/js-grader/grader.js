// `example/grader/keywords-js`: an mst grader written in JavaScript.
//
// Scores the share of hidden keywords the final answer contains. The keywords are the granted
// secret `EXAMPLE_KEYWORDS` (separated by `,`), kept out of the eval's files so that an agent
// that can read them cannot learn what is being looked for; the reason says how many were
// found, never which. The option `threshold` (default 1) is the share needed to pass. Each
// verdict is also written to the host's log.
//
// Built by `cargo xtask plugins` into plugins/dist/examples/keywords-js.wasm; by hand, here:
//   componentize-js grader.js --wit ../../../wit --world-name grader \
//     --disable http fetch-event -o keywords-js.wasm

import { log } from "mst:plugin/log@0.1.0";
import { get as getSecret } from "mst:plugin/secrets@0.1.0";

const SECRET = "EXAMPLE_KEYWORDS";

const SCHEMA = JSON.stringify({
  type: "object",
  additionalProperties: false,
  properties: { threshold: { type: "number", minimum: 0, maximum: 1 } },
});

// Thrown, a `plugin-error` record is the call's `err`: the trial is "not graded", with this
// message.
function fail(code, message) {
  return { code, message };
}

function threshold(options) {
  try {
    return JSON.parse(options).threshold ?? 1;
  } catch (e) {
    throw fail("invalid-options", `options are not JSON: ${e}`);
  }
}

export const plugin = {
  // Pure: the host calls it with nothing granted.
  info() {
    return {
      name: "example/grader/keywords-js",
      version: "0.1.0",
      description: "Share of the hidden keywords in EXAMPLE_KEYWORDS the answer has (JavaScript)",
      capabilities: [{ tag: "secret", val: SECRET }],
      optionsSchema: SCHEMA,
    };
  },
};

export const grading = {
  gradeTrial(options, trial) {
    const needed = threshold(options);
    // An error (not granted, not set) propagates: the trial is not graded.
    const words = getSecret(SECRET)
      .split(",")
      .map((w) => w.trim().toLowerCase())
      .filter((w) => w !== "");
    if (words.length === 0) {
      throw fail("invalid-input", `the secret ${SECRET} holds no keywords`);
    }
    const answer = (trial.trace.finalText ?? "").toLowerCase();
    const found = words.filter((w) => answer.includes(w)).length;
    const value = found / words.length;
    const reason = `${found} of ${words.length} hidden keywords`;
    log("info", `case ${trial.case.id}: ${reason}`);
    return { value, pass: value >= needed, reason, details: undefined };
  },
};
