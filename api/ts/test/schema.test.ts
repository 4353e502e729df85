// The committed src/schema.d.ts is what openapi-typescript makes of api/openapi.yaml today: when the spec changes,
// run `make generate` (or `npm run generate` here) and commit the result.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../..", import.meta.url)); // api/ts (this file runs from dist/test)

test("src/schema.d.ts is generated from api/openapi.yaml", () => {
  const dir = mkdtempSync(join(tmpdir(), "retrysafe-schema-"));
  try {
    const fresh = join(dir, "schema.d.ts");
    execFileSync(join(root, "node_modules", ".bin", "openapi-typescript"), ["../openapi.yaml", "--output", fresh], {
      cwd: root,
      stdio: ["ignore", "ignore", "inherit"],
    });
    const committed = readFileSync(join(root, "src", "schema.d.ts"), "utf8");
    assert.ok(
      readFileSync(fresh, "utf8") === committed,
      "api/ts/src/schema.d.ts differs from what api/openapi.yaml generates: run make generate",
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
