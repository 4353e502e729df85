// Drives `retrysafe mcp` with the official TypeScript MCP SDK client, the way an MCP host does: list the tools, call
// create_ticket, and kill the server in the middle of the call (after the request left, before the answer was
// read); a new server on the same journal, called with the same action_id, settles it without a second ticket.
// cmd/retrysafe's TestMCPTypeScriptClient starts the services, sets these variables and counts the tickets after.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

function required(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is unset: run this through go test ./cmd/retrysafe -run TestMCPTypeScriptClient (make test)`);
  }
  return value;
}

const bin = required("RETRYSAFE_BIN");
const journal = required("RETRYSAFE_JOURNAL");
const title = required("RETRYSAFE_TICKET_TITLE");
const env = { PATH: process.env.PATH ?? "", TICKETS_URL: required("TICKETS_URL"), AGENT_API_KEY: required("AGENT_API_KEY") };

// connect starts `retrysafe mcp` on the journal (with extra environment) and connects a client to it.
async function connect(extra = {}) {
  const transport = new StdioClientTransport({
    command: bin,
    args: ["mcp", "--journal", journal],
    env: { ...env, ...extra },
    stderr: "pipe",
  });
  let log = "";
  transport.stderr?.on("data", (chunk) => {
    log += chunk;
  });
  const client = new Client({ name: "retrysafe-ts-test", version: "0.1.0" });
  await client.connect(transport);
  return { client, transport, log: () => log };
}

const args = { action_id: "ts-ticket-1", project: "mcp-ts", title };

test("one ticket for two calls with one action_id, the server killed between them", async () => {
  // The first server pauses right after the request left; it is killed there.
  const first = await connect({ RETRYSAFE_AGENT_FAILPOINTS: "agent.after_send=pause" });
  const { tools } = await first.client.listTools();
  const names = tools.map((t) => t.name);
  for (const name of ["create_ticket", "get_operation", "retry_action"]) {
    assert.ok(names.includes(name), `tools/list has no ${name}: ${names}`);
  }
  const create = tools.find((t) => t.name === "create_ticket");
  assert.ok(create?.inputSchema.required?.includes("action_id"), "create_ticket does not require action_id");

  const pending = first.client.callTool({ name: "create_ticket", arguments: args }).catch((err) => err);
  for (let i = 0; !first.log().includes("failpoint agent.after_send reached"); i++) {
    assert.ok(i < 600, `the server never reached the failpoint:\n${first.log()}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const pid = first.transport.pid;
  assert.ok(pid, "no server pid");
  process.kill(pid, "SIGKILL");
  const lost = await pending;
  assert.ok(lost instanceof Error, `the killed server answered: ${JSON.stringify(lost)}`);
  await first.client.close().catch(() => {});

  // A new server, the same journal, the same action_id: the interrupted attempt is looked up and sent again with
  // the same key; the service replays its answer.
  const second = await connect();
  try {
    const result = await second.client.callTool({ name: "create_ticket", arguments: args });
    assert.equal(result.isError ?? false, false, JSON.stringify(result));
    const r = result.structuredContent;
    assert.equal(r.state, "succeeded", JSON.stringify(r));
    assert.equal(r.action_id, args.action_id);
    assert.ok(r.attempts >= 2, `attempts ${r.attempts}: want the interrupted one and its retry`);
    assert.equal(r.body.title, title);

    // Called again: the journal answers, nothing is sent.
    const again = await second.client.callTool({ name: "create_ticket", arguments: args });
    assert.equal(again.structuredContent.operation_id, r.operation_id);
    assert.equal(again.structuredContent.attempts, r.attempts);

    // A bad argument is refused before anything is journaled, naming the argument.
    const bad = await second.client.callTool({ name: "create_ticket", arguments: { ...args, action_id: "ts-bad", priority: "asap" } });
    assert.equal(bad.isError, true);
    assert.equal(bad.structuredContent.code, "bad_arguments");
    assert.deepEqual(bad.structuredContent.arguments.map((a) => a.argument), ["priority"]);
  } finally {
    await second.client.close();
  }
});
