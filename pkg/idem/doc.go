// Package idem makes a write endpoint safe to retry: one Idempotency-Key runs the write once, and every retry
// gets the first answer back (Idempotent-Replayed: true), a conflict if it is another request, or the truth about
// a write still running or whose outcome is unknown. Each claim is an operation of package opstatus, so a caller
// that timed out can ask what happened. docs/contract.md is the HTTP contract it keeps.
//
//	request ─► begin: key, fingerprint (canonical JSON of method, route, params, account, command), lineage
//	   │          └─ malformed ─► 400
//	   ▼
//	readKey ── found ─► decide: replay │ conflict 422 │ in progress 409 │ unknown 202 ─► record attempt ─► answer
//	   │ none                  ▲
//	   ▼                       │ key taken (a copy committed first)
//	BEGIN + claim ── external: one round trip; local: with the write's first statement
//	   │   local: the key's lock, and the key read again under it
//	   │   external: INSERT the operation, running, holding the key
//	   ▼
//	Guard, then   local: write(tx) ─► INSERT the operation completed, with the response, one record + COMMIT ─► answer
//	              external: Prepare(tx), COMMIT ─► Call ─► Record(tx): outcome + response on the operation ─► answer
//	                                                  └─ lost ─► unknown, 202 (a Reconciler settles it)
//
// A key is a column of the operation it started (package opstore writes it). Local mode (Handler.Run) is for
// effects in the same database: the claim, the write, the operation and its stored response commit together, so
// a crash leaves nothing and the key free, and a local create writes its operation once, one record and its own
// rows; a concurrent copy waits on the key's lock and then replays. A row the write inserts with a foreign key to
// its operation needs that key DEFERRABLE INITIALLY DEFERRED: the operation comes after it. External mode
// (RunExternal) is for effects that leave the process: the claim commits first with a lease, the effect runs
// outside any transaction, its result is recorded after.
//
// The core speaks context.Context, http.Header and Answer; Handler.Handle adapts it to net/http and package
// idemgin to gin. The write gets a *gorm.DB inside the claim's transaction (database.Tx), whatever the gorm
// configuration of Handler.DB. A local claim waits for the write's first statement: sent through
// database.Query, that statement carries it in the same round trip (the tickets store does this); a gorm
// statement cannot, and the claim goes just before it. The library's statements are package opstore's; the tables it needs come
// from migrations/.
package idem
