// `{plugin}`: passes when the final answer equals the expected text, ignoring surrounding
// white space. Replace `gradeTrial` with your own logic.

import { log } from "mst:plugin/log@0.1.0";

const SCHEMA = JSON.stringify({
  type: "object",
  additionalProperties: false,
  properties: { expected: { type: "string" } },
});

// Thrown, a `plugin-error` record is the call's `err`: the trial is "not graded".
function invalidOptions(message) {
  return { code: "invalid-options", message };
}

export const plugin = {
  // Pure and fast: the host calls it to check and install the plugin, granting nothing.
  info() {
    return {
      name: "{plugin}",
      version: "0.1.0",
      description: "Exact match on the final answer",
      capabilities: [],
      optionsSchema: SCHEMA,
    };
  },
};

export const grading = {
  gradeTrial(options, trial) {
    let expected;
    try {
      expected = JSON.parse(options).expected;
    } catch (e) {
      throw invalidOptions(`options are not JSON: ${e}`);
    }
    if (expected === undefined && trial.case.expected !== undefined) {
      expected = JSON.parse(trial.case.expected);
    }
    if (typeof expected !== "string") {
      throw invalidOptions("set `expected`, or give the case an expected string");
    }
    const answer = (trial.trace.finalText ?? "").trim();
    const pass = answer === expected.trim();
    const reason = pass ? "exact match" : `expected ${JSON.stringify(expected)}, got ${JSON.stringify(answer)}`;
    log("debug", `case ${trial.case.id}: ${reason}`);
    return { value: pass ? 1 : 0, pass: undefined, reason, details: undefined };
  },
};
