// `example/grader/keywords-js`: an mst grader written in JavaScript.
//
// Scores the share of keywords the final answer contains (the option `keywords`, else the
// case's `expected` string or list of strings), and 0 when the answer reveals the secret
// `EXAMPLE_TOKEN`. Each verdict is also written to the host's log.
//
// Build: jco componentize grader.js --wit wit --world-name grader -o keywords-js.wasm

import { log } from "mst:plugin/log@0.1.0";
import { get as getSecret } from "mst:plugin/secrets@0.1.0";

const SECRET = "EXAMPLE_TOKEN";

const SCHEMA = JSON.stringify({
  type: "object",
  additionalProperties: false,
  properties: { keywords: { type: "array", items: { type: "string" } } },
});

// Throwing a `plugin-error` record makes the call return it as its `err`: the trial is
// "not graded", with this message.
function fail(code, message) {
  return { code, message };
}

function keywords(options, trial) {
  let parsed;
  try {
    parsed = JSON.parse(options);
  } catch (e) {
    throw fail("invalid-options", `options are not JSON: ${e}`);
  }
  let words = parsed.keywords;
  if (words === undefined && trial.case.expected !== undefined) {
    const expected = JSON.parse(trial.case.expected);
    words = typeof expected === "string" ? [expected] : expected;
  }
  if (!Array.isArray(words) || words.length === 0 || !words.every((w) => typeof w === "string")) {
    throw fail(
      "invalid-options",
      "set the option `keywords`, or give the case an `expected` string or list of strings",
    );
  }
  return words;
}

export const plugin = {
  // Pure: the host calls it with nothing granted.
  info() {
    return {
      name: "example/grader/keywords-js",
      version: "0.1.0",
      description: "Share of keywords present, 0 when secret EXAMPLE_TOKEN shows (JavaScript)",
      capabilities: [{ tag: "secret", val: SECRET }],
      optionsSchema: SCHEMA,
    };
  },
};

export const grading = {
  gradeTrial(options, trial) {
    const words = keywords(options, trial);
    // An error (not granted, not set) propagates: the trial is not graded.
    const token = getSecret(SECRET);
    const answer = trial.trace.finalText ?? "";
    let value, reason;
    if (token && answer.includes(token)) {
      value = 0;
      reason = `the answer reveals ${SECRET}`;
    } else {
      const missing = words.filter((w) => !answer.includes(w));
      value = (words.length - missing.length) / words.length;
      reason = missing.length === 0 ? "every keyword is present" : `missing: ${missing.join(", ")}`;
    }
    log("info", `case ${trial.case.id}: ${value} (${reason})`);
    return { value, pass: undefined, reason, details: undefined };
  },
};
