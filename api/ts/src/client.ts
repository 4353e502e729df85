// A TypeScript client of the retrysafe HTTP API. The types in schema.d.ts are generated from api/openapi.yaml
// (npm run generate, or make generate at the repository root); openapi-fetch turns them into typed requests, so a
// path, parameter or body the spec does not have fails to compile.
//
//   const api = createRetrysafeClient("http://127.0.0.1:8081", process.env.RETRYSAFE_API_KEY!);
//   const key = crypto.randomUUID(); // one per intended action, reused on every retry
//   const { data, error, response } = await api.POST("/v1/tickets", {
//     params: { header: { "Idempotency-Key": key } },
//     body: { project: "ops", title: "Rotate the staging certificate" },
//   });
//   // a retry with the same key answers the same body with Idempotent-Replayed: true
import createClient, { type Client } from "openapi-fetch";
import type { components, operations, paths } from "./schema.js";

export type { components, operations, paths };
export type Problem = components["schemas"]["Problem"];

/** A client of one retrysafe service (tickets, payments or deploys) that sends the account's bearer secret. */
export function createRetrysafeClient(baseUrl: string, secret: string): Client<paths> {
  const client = createClient<paths>({ baseUrl });
  client.use({
    onRequest({ request }) {
      request.headers.set("Authorization", `Bearer ${secret}`);
      return request;
    },
  });
  return client;
}
