// Drives a running tickets service through the generated client, the way a TypeScript caller with nothing but
// api/openapi.yaml would: create, retry with the same key (a replay), then reuse the key for another body (the 422
// problem). cmd/retrysafe's TestTypeScriptClient starts the service on a test schema and sets these variables.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { createRetrysafeClient, type components } from "../src/client.js";

function required(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is unset: run this through go test ./cmd/retrysafe -run TestTypeScriptClient (make test)`);
  }
  return value;
}

test("a retried create replays, a reused key is a 422 problem", async () => {
  const api = createRetrysafeClient(required("RETRYSAFE_TICKETS_URL"), required("RETRYSAFE_API_KEY"));
  const key = randomUUID();
  const body: components["schemas"]["CreateTicket"] = { project: "ops", title: "Rotate the staging certificate", priority: "high" };
  const create = () => api.POST("/v1/tickets", { params: { header: { "Idempotency-Key": key } }, body });

  const first = await create();
  assert.equal(first.response.status, 201, JSON.stringify(first.error));
  assert.ok(first.data, "no body on the 201");
  assert.equal(first.data.title, body.title);
  assert.equal(first.data.deduplicated, false);
  assert.notEqual(first.response.headers.get("Idempotent-Replayed"), "true");
  const operationId = first.response.headers.get("Operation-Id");
  assert.match(operationId ?? "", /^op_/);

  const again = await create();
  assert.equal(again.response.status, 201, JSON.stringify(again.error));
  assert.equal(again.response.headers.get("Idempotent-Replayed"), "true");
  assert.equal(again.response.headers.get("Operation-Id"), operationId);
  assert.deepEqual(again.data, first.data);

  const reused = await api.POST("/v1/tickets", {
    params: { header: { "Idempotency-Key": key } },
    body: { ...body, title: "Rotate the PRODUCTION certificate" },
  });
  assert.equal(reused.response.status, 422);
  assert.equal(reused.data, undefined);
  assert.match(reused.response.headers.get("Content-Type") ?? "", /^application\/problem\+json/);
  assert.equal(reused.error?.code, "idempotency_key_reused");
  assert.equal(reused.error?.status, 422);
  assert.equal(reused.error?.operation_id, operationId);

  // The effect: one ticket, and one operation under the key.
  const list = await api.GET("/v1/tickets");
  assert.equal(list.response.status, 200);
  assert.deepEqual(list.data?.items.map((t) => t.id), [first.data.id]);
  const ops = await api.GET("/v1/operations", { params: { query: { idempotency_key: key } } });
  assert.equal(ops.response.status, 200);
  assert.deepEqual(ops.data?.items.map((o) => [o.id, o.state]), [[operationId, "succeeded"]]);
});
