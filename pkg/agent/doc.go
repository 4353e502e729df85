// Package agent is the caller's half of retrysafe's promise: an AI agent (or a script) makes writes to HTTP
// services through it (services on pkg/idem: the demo tickets, payments and deploys, or yours), and each intended
// action has exactly one effect, whatever fails: the network, the service, or the agent itself, killed at any
// instruction.
//
// # Tools
//
// What the agent can write is a Catalog of tools read from a tools file (LoadTools, whose documentation
// has the format): each tool names its service (whose base URL comes from a variable the file names), method,
// route template, retry mode and the JSON Schema of its arguments. DemoTools, the embedded demo-tools.yaml, is
// the demo services' file and the default. Arguments are checked against the schema before anything is journaled
// or sent: a bad argument is an ArgumentError naming it, and the action id stays free for the corrected call.
//
// A tool of kind command runs a command line over SSH on a host of the tools file (or locally), in the same
// journal: an attempt records the host key it checked before the command is sent, and the execution boundary it
// reached after (not_started, started, exit_received). Its family (read, converge, effect) is its retry rule after
// a lost connection; an effect runs again only when the host's operation marker (package opmarker, `retrysafe
// marker`) answers for it, or a person decides.
//
// The services dedupe by Idempotency-Key. That protects a caller only if it keeps its side: one key per intended
// action, made before the first send, kept across its own crash, reused on every retry, never reused for a
// changed intent. This package keeps that side, in a journal file, and adds the retry rule and the evidence.
//
// # Actions, operations, attempts, observations
//
// The caller names each intended action with an action id of its choosing ("alert-7c91-ticket"). The first
// Do for an action id creates an operation: an id, an idempotency key, the tool, its route template, the
// arguments and their canonical fingerprint (SHA-256 over RFC 8785 JSON), the tool's retry mode, and the run
// that delegated the action, if one did (DoOptions.ParentRun). The operation is written to the journal and
// fsynced before anything is sent. Each HTTP send is an attempt, journaled before it
// leaves (attempt_started: id, parent, retry reason from the services' fixed list, the rule's decision, budget
// left) and after (attempt_finished: dispatch state not_sent, sent_no_response, response_received or
// execution_error; status, the service's code and Operation-Id, duration). What the agent learns without sending
// the write again is an observation: an operation lookup or poll, found or not found, and an attempt that a dead
// process left without an end. Every attempt sends Attempt-Id, Agent-Run-Id and, for a retry, Retry-Of and
// Retry-Reason, so the service's own audit records match the journal's.
//
// A later Do with the same action id and the same arguments (spelled any way: key order and spacing do not
// matter) continues that operation with the same key, or returns how it ended without sending. With other
// arguments it returns ErrChangedIntent and sends nothing: a changed intent is a new action id, with
// DoOptions.Supersedes naming the old one, which the service records as Supersedes-Operation-Id. A replacement
// is not sent while the old operation may or may not have happened (the service holds it unknown, or its last
// attempt may have reached the service unanswered): it stops needs_human with code superseded_operation_unknown,
// its reason naming that operation, its last dispatch and why it is unknown, and goes when called again once the
// old one settled, or with a person's approval_id (request_approval names the operation replaced, which the
// service shows the approver). A refund that corrects a duplicate (an operation the service settled
// duplicate_effect_confirmed) is a new action with DoOptions.Remediates naming that operation: it goes with
// Remediates-Operation-Id and is journaled with it.
//
// # One key per action, wherever it runs
//
// The idempotency key is derived from a namespace and the action id under the namespace's secret (HMAC-SHA256,
// "idk_" and 32 hex digits; the secret is the API key by default, Config.NamespaceSecret with a namespace of your
// own, so only those who hold it can compute a key), not
// drawn at random, so two journals given one action (two agents, or a worker handed the action by the run that
// planned it) send one key, and the service runs it once: it dedupes what the journals cannot see of each
// other. The namespace (Config.Namespace, AGENT_NAMESPACE) should be the account, the scope of the services'
// keys; the services do not tell a caller its account, so the default is the agent's key id (Principal): one key
// is of one account, and agents sharing a key converge with no setting. Agents of one account with different
// keys converge when given one namespace; unrelated agents sharing a key and reusing action ids need their own.
// Journals written before keys were derived keep, and resume with, the random keys they hold.
//
// A planner that hands an action to a worker (DoOptions.DelegateTo) keeps the operation and its retries: the
// worker (DoOptions.ParentOperation) never sends a write again on its own after an attempt that may have reached
// the service, and the planner never sends it at all; it reads the worker's journal, then the service's record
// under the key (delegate.go).
//
// # The retry rule
//
// Each tool declares a RetryMode: read_only, converge (a declared final state), create, financial, destructive.
//
//   - not sent (connection refused): send again.
//   - sent, no answer (or an attempt a dead process left): for keyed tools, look the operation up first
//     (GET /v1/operations?idempotency_key=), an observation, positive or negative, then send again with the same
//     key; the services dedupe by key. Financial and destructive tools never send again before a lookup answered;
//     create tools do when the lookup itself fails, since the key still dedupes. Converge tools send the same state
//     again.
//   - 409 request_in_progress, 429, 5xx: send again with the same key after Retry-After (at least the backoff,
//     full jitter, exponential). A request_in_progress retry is journaled with its own reason,
//     request_in_progress, and sent as rate_limited until the services list it (Attempt.RetryReasonSent).
//   - 202 with an operation (unknown outcome, or accepted work such as a deploy), or 503 outcome_unknown: poll the
//     operation until it settles; an unknown one is sent again with the same key after a few polls, which makes
//     the service reconcile it at once. Still unknown when the call stops waiting (or the budget is spent): the
//     state unknown, which resume keeps driving; still running: in_progress.
//   - 409 idempotency_response_expired (the service kept the key, not its stored answer): settled from the state
//     the answer names, or followed as a 202.
//   - a key past the key_expires_at the service published (less an hour for clock skew) is never sent again: the
//     operation settles from a lookup or poll made since, or goes to a person (needs_human).
//   - 409 superseded_operation_unknown: needs_human, with the next step (settle the old operation, or an approval).
//   - 422 idempotency_key_reused: refused, never retried (a changed intent).
//   - 428 approval_required: needs_human, with the next step (request_approval, then Do again with approval_id).
//   - 502 provider_unavailable, provider_declined: failed (the service says it did not happen).
//   - any other 4xx: refused, final.
//   - the attempt budget (Config.Budget, default 5) spent: needs_human, with the evidence. Agent.Retry takes it
//     out with the same key when a person asks (journaled: who, why, the new budget); never with a new key,
//     which is a new action id that supersedes this one.
//
// Resume drives every operation the journal has not finished to one of those ends, from evidence: it looks up,
// then retries with the same key, or hands over to a person. It never makes a new key for an operation.
//
// # What the service acknowledged and lost
//
// A database promoted from an asynchronous standby can lose writes it acknowledged: the journal says succeeded,
// the service has no operation, no key and no resource, and a provider behind it keeps what it did. Such an
// operation is sent again under its own key and body (journaled operation_lost, then its attempts): the service
// makes it once more, and a provider keyed by the Idempotency-Key replays its call. A later action whose path
// names what an earlier action of the journal made (a capture's intent id, the id the create's answer named)
// depends on it: a 404 for it makes the agent ask for the earlier action's operation, and when the service
// answers 404 for that too, the earlier action is made again first, and the later one goes again under its key
// (dependency_remade) to the resource made again, instead of settling refused. Agent.Verify (`retrysafe agent
// verify`) asks for every acknowledged operation of the journal and does the same, in journal order. Only keyed
// requests the service acknowledged are sent so: never a command, an action handed to a worker or carried out
// for a parent, or an approval request (lost.go).
//
// # The journal
//
// One file of JSON lines, each an auditchain record (the server's audit chain format and code: RFC 8785, SHA-256,
// each record linked to the one before), written with one write and fsync. An append-only file, rather than
// SQLite, because the journal is exactly an append-only chain, read whole at start; it needs no query, no schema
// and no dependency, and a hash chain over lines is checked by the same verifier as the server's. VerifyJournal
// (and `retrysafe audit verify --journal PATH`) checks it offline. A line the kernel never finished writing is
// outside the chain; the next writer discards it (nothing was acted on after it). Open verifies the chain
// first and refuses a broken journal (ErrJournalBroken): resume acts on what the journal says.
//
// The journal is locked (flock) for as long as an Agent has it open: a second process waits up to
// Config.LockWait, then gets ErrJournalLocked. Two agents on one journal take turns and never double an
// effect through it. The lock dies with its holder, even on SIGKILL.
//
// The journal holds the arguments (resume must resend them) but never the API key: it records
// Config.AuthorityRef instead, and a key id the agent derives from the key (Principal). Put no secret in
// arguments.
//
// A journal acts for one key, the one its operations were made with. Idempotency keys are scoped to an
// account: under a key of another account, a lookup finds nothing and a retry does the effect a second time,
// there. Open refuses such a journal with ErrOtherPrincipal, as it does a journal whose operations were
// journaled without their key (written before keys were recorded); Config.SameAccount is the operator saying
// the key is a new one of the same account, and binds the journal to it once the services confirm it: each
// unsettled operation that may have reached a service under another key must be visible to the new key (by
// its server operation id, or one of the same key's, or its idempotency key), or Open refuses and sends nothing.
//
// Open refuses, and leaves as it is, anything that is not a journal (ErrNotJournal): a symbolic link (the
// journal is opened with O_NOFOLLOW), a file that is not regular, an empty file (a new journal appears with its
// first record, so an agent never leaves one empty), a file whose first line, or whose unfinished last line, is
// not the start of a record. A journal is mode 0600: a new one is made so, and one others could read or write is
// made so, with a warning (Config.Warn), or refused when the agent may not change its mode.
//
// A call is refused before anything is journaled or sent when it could never leave: arguments or a body over
// Config.MaxBodyBytes, an approval_id that is not an id, any header value HTTP forbids. What show prints from a
// model, a service or the journal goes through Printable, so no control or bidirectional character reaches a
// terminal raw.
//
// # States
//
// A result's state is one of: succeeded; failed (the service says it did not happen); refused (a 4xx, or a
// changed intent); needs_human (an approval, a spent budget, an expired key, a held replacement: next_step says
// what a person does); unknown (the service itself does not know yet whether it happened and is reconciling it:
// call again with the same action id, never a new one); in_progress (the service accepted the work and is still
// doing it); unresolved (a delegated operation whose worker died or stopped with an unknown outcome, and that
// the service's record has not settled); open (created, not settled). Resume drives open, in_progress, unknown and
// unresolved operations.
//
// # Commands
//
// cmd/retrysafe wraps this package as `retrysafe agent do|resume|retry|resolve|verify|show` for shell-driven agents and as
// `retrysafe mcp` (package agentmcp) for MCP clients. `agent do` exits 0 succeeded, 3 needs_human or in_progress,
// 4 refused, 5 failed, 6 unknown, 1 usage or internal error; `agent resume` exits 3 while any operation waits for
// a person or the service, else 6 while any is unknown; `agent verify` exits 0 when the services have every
// operation they acknowledged, 7 when some were lost and all of them made again, 3 when one was not. Requests go through net/http rather than the generated
// api/client: the rule is the same for every route, and needs each answer's raw status, headers and body, and
// the moment the request was written (httptrace), which a typed per-endpoint client hides.
package agent
