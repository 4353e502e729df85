package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"gorm.io/gorm"

	"github.com/retrysafe/retrysafe/pkg/agent"
	"github.com/retrysafe/retrysafe/pkg/audit"
	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/database"
	"github.com/retrysafe/retrysafe/pkg/opstatus"
	"github.com/retrysafe/retrysafe/pkg/opstore"
)

// auditCommand is `retrysafe audit verify|export|public-key|timeline`.
func auditCommand() command {
	return command{
		name:     "audit",
		synopsis: "audit verify|export|public-key|timeline ...",
		summary: "check the audit record (verify [--since RFC3339] [--operation ID] [--public-key B64] [--seal HASH] " +
			"[--journal PATH | --bundle FILE]: exit 0 intact, 1 broken or sealing stalled (a record unsealed for over 10 " +
			"AUDIT_SEAL_INTERVALs), 2 could not check; it only reads; --bundle checks an exported bundle with no database, " +
			"--seal fails unless the seals include that hash, kept elsewhere), write records with what checks them to " +
			"stdout (export [--since RFC3339] [--until RFC3339] [--operation ID] > FILE: the records, the seals holding " +
			"them, the public key), print the seal signing key (public-key), or show an operation's history (timeline " +
			"OPERATION_ID)",
		check: checkAudit, run: runAudit,
		env: databaseEnv + `
  AUDIT_SIGNING_KEY         Ed25519 seed (32 bytes, base64) that signs seals; verify checks signatures
                            with its public key unless --public-key names another
  AUDIT_SEAL_INTERVAL       the sequencers' interval (default 1s): verify exits 1 when a record has waited
                            more than 10 of them to be sealed
` + commonEnv,
	}
}

// openAuditDB opens the database for a read of the whole record: one statement streams every chain, so
// DB_STATEMENT_TIMEOUT, the bound of a request's statements, does not apply.
// A database that cannot be reached is said at once, naming where it was looked for.
func openAuditDB(cfg config) (*gorm.DB, error) {
	cfg.DBStatementTimeout = 0
	db, err := openDB(cfg)
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.DBConnectTimeout)
	defer cancel()
	if err := sqlDB.PingContext(ctx); err != nil {
		sqlDB.Close()
		return nil, openDBError(cfg, err)
	}
	return db, nil
}

// openAuditPool is openAuditDB's pool as the library's packages take it.
func openAuditPool(cfg config) (database.Pool, error) {
	db, err := openAuditDB(cfg)
	if err != nil {
		return nil, err
	}
	return database.PoolOf(db)
}

type verifyFlags struct {
	since     time.Time
	operation string
	publicKey ed25519.PublicKey
	journal   string
	bundle    string
	seal      string
}

func parseVerifyFlags(args []string, out io.Writer) (verifyFlags, error) {
	fs := flag.NewFlagSet("audit verify", flag.ContinueOnError)
	fs.SetOutput(out)
	since := fs.String("since", "", "check the seals written at or after this time (RFC 3339), their records and the unsealed ones")
	op := fs.String("operation", "", "check this operation's records only (and its approvals')")
	pub := fs.String("public-key", "", "require seals signed by this Ed25519 public key (base64)")
	journal := fs.String("journal", "", "check an agent's journal file instead of the database (offline)")
	bundle := fs.String("bundle", "", "check a bundle written by audit export instead of the database (offline)")
	seal := fs.String("seal", "", "fail unless the seals checked include the one with this hash")
	if err := fs.Parse(args); err != nil {
		return verifyFlags{}, usageError{"audit verify: " + err.Error()}
	}
	if fs.NArg() > 0 {
		return verifyFlags{}, usageError{fmt.Sprintf("audit verify takes no arguments, got %q", fs.Args())}
	}
	var f verifyFlags
	f.operation, f.journal, f.bundle, f.seal = *op, *journal, *bundle, *seal
	if f.bundle != "" && (f.journal != "" || f.operation != "" || *since != "") {
		return verifyFlags{}, usageError{"audit verify: --bundle checks the bundle as exported: no --journal, --operation or --since"}
	}
	if f.journal != "" && f.seal != "" {
		return verifyFlags{}, usageError{"audit verify: a journal has no seals to pin"}
	}
	var err error
	if f.since, err = parseTimeFlag("audit verify", "since", *since); err != nil {
		return verifyFlags{}, err
	}
	if *pub != "" {
		k, err := auditchain.ParsePublicKey(*pub)
		if err != nil {
			return verifyFlags{}, usageError{"audit verify: --public-key: want 32 bytes in base64"}
		}
		f.publicKey = k
	}
	return f, nil
}

// parseTimeFlag reads an RFC 3339 time flag; empty is the zero time.
func parseTimeFlag(cmd, name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, usageError{fmt.Sprintf("%s: --%s %q is not an RFC 3339 time", cmd, name, v)}
	}
	return t, nil
}

func parseExportFlags(args []string, out io.Writer) (audit.ExportOptions, error) {
	fs := flag.NewFlagSet("audit export", flag.ContinueOnError)
	fs.SetOutput(out)
	since := fs.String("since", "", "the seals written at or after this time (RFC 3339), their records and the unsealed ones")
	until := fs.String("until", "", "the seals written at or before this time (RFC 3339) and their records")
	op := fs.String("operation", "", "this operation's records and its approvals', whole")
	if err := fs.Parse(args); err != nil {
		return audit.ExportOptions{}, usageError{"audit export: " + err.Error()}
	}
	if fs.NArg() > 0 {
		return audit.ExportOptions{}, usageError{fmt.Sprintf("audit export takes no arguments, got %q", fs.Args())}
	}
	opt := audit.ExportOptions{OperationID: *op}
	if *op != "" && (*since != "" || *until != "") {
		return audit.ExportOptions{}, usageError{"audit export: --operation exports the whole operation: no --since or --until"}
	}
	var err error
	if opt.Since, err = parseTimeFlag("audit export", "since", *since); err != nil {
		return audit.ExportOptions{}, err
	}
	if opt.Until, err = parseTimeFlag("audit export", "until", *until); err != nil {
		return audit.ExportOptions{}, err
	}
	return opt, nil
}

func checkAudit(args []string) error {
	if len(args) == 0 {
		return usageError{"audit needs a subcommand: verify, export, public-key or timeline"}
	}
	switch args[0] {
	case "verify":
		_, err := parseVerifyFlags(args[1:], io.Discard)
		return err
	case "export":
		_, err := parseExportFlags(args[1:], io.Discard)
		return err
	case "public-key":
		if len(args) > 1 {
			return usageError{"audit public-key takes no arguments"}
		}
		return nil
	case "timeline":
		if len(args) != 2 {
			return usageError{"audit timeline takes one OPERATION_ID"}
		}
		return nil
	}
	return usageError{fmt.Sprintf("unknown audit subcommand %q: want verify, export, public-key or timeline", args[0])}
}

func runAudit(ctx context.Context, inv invocation) error {
	switch inv.args[0] {
	case "public-key":
		if inv.cfg.AuditSigningKey == nil {
			return exitError{code: 2, err: errors.New("audit public-key: AUDIT_SIGNING_KEY is unset: seals are not signed")}
		}
		_, err := fmt.Fprintln(inv.stdout, inv.cfg.AuditSigningKey.PublicKey())
		return err
	case "verify":
		return runAuditVerify(ctx, inv)
	case "export":
		return runAuditExport(ctx, inv)
	case "timeline":
		return runAuditTimeline(ctx, inv, inv.args[1])
	}
	return usageError{"unknown audit subcommand"}
}

func runAuditVerify(ctx context.Context, inv invocation) error {
	f, err := parseVerifyFlags(inv.args[1:], inv.stdout)
	if err != nil {
		return err
	}
	if f.journal != "" {
		return verifyJournalAndGrants(ctx, inv, f.journal)
	}
	pub, keyNote := verifyKey(f.publicKey, inv.cfg)
	var v verification
	if f.bundle != "" {
		v, err = verifyBundleFile(inv.stdout, f, pub, keyNote)
	} else {
		v, err = verifyDatabase(ctx, inv.cfg, f, pub, keyNote)
	}
	if err != nil {
		return exitError{code: 2, err: err}
	}
	return printVerification(inv.stdout, f, v, inv.cfg.AuditSealInterval)
}

// verification is what `audit verify` checked, and when.
type verification struct {
	rep audit.Report
	// keyNote says which key the signatures were checked with, if any.
	keyNote string
	// readAt is when the records were read: a record's wait for a seal is judged then, now or when the bundle
	// was exported (readWhen says which, for the STALLED line).
	readAt   time.Time
	readWhen string
}

// verifyKey is the public key the seals' signatures are checked with (--public-key, else AUDIT_SIGNING_KEY's;
// nil when neither is set), and the note that says so.
func verifyKey(flagKey ed25519.PublicKey, cfg config) (ed25519.PublicKey, string) {
	switch {
	case flagKey != nil:
		return flagKey, "checked with --public-key"
	case cfg.AuditSigningKey != nil:
		pub, _ := auditchain.ParsePublicKey(cfg.AuditSigningKey.PublicKey())
		return pub, "checked with AUDIT_SIGNING_KEY's public key"
	}
	return nil, "not checked (no public key given): a rewrite that recomputes every hash would pass"
}

// verifyDatabase checks the audit record in the database.
func verifyDatabase(ctx context.Context, cfg config, f verifyFlags, pub ed25519.PublicKey, keyNote string) (verification, error) {
	readAt := time.Now()
	db, err := openAuditPool(cfg)
	if err != nil {
		return verification{}, err
	}
	rep, err := audit.Verify(ctx, db, audit.VerifyOptions{Since: f.since, OperationID: f.operation, PublicKey: pub,
		Seal: f.seal})
	if err != nil {
		return verification{}, err
	}
	return verification{rep: rep, keyNote: keyNote, readAt: readAt}, nil
}

// verifyBundleFile checks the bundle f names, and prints what it was exported for.
func verifyBundleFile(w io.Writer, f verifyFlags, pub ed25519.PublicKey, keyNote string) (verification, error) {
	brep, err := verifyBundle(f, pub)
	if err != nil {
		return verification{}, err
	}
	if brep.KeyFromBundle {
		keyNote = "checked with the bundle's own public key: compare it with the key the operator published, or give --public-key"
	}
	fmt.Fprintf(w, "bundle %s: %s, exported at %s\n", f.bundle, bundleScope(brep), brep.ExportedAt.UTC().Format(time.RFC3339))
	return verification{rep: brep.Report, keyNote: keyNote, readAt: brep.ExportedAt,
		readWhen: " by the time the bundle was exported"}, nil
}

// bundleScope says what a bundle holds: an operation, a time range, or the whole record.
func bundleScope(brep audit.BundleReport) string {
	switch {
	case brep.Operation != "":
		return "operation " + brep.Operation
	case brep.Since.IsZero() && brep.Until.IsZero():
		return "the whole record"
	}
	scope := "seals and records"
	if !brep.Since.IsZero() {
		scope += " since " + brep.Since.UTC().Format(time.RFC3339)
	}
	if !brep.Until.IsZero() {
		scope += " until " + brep.Until.UTC().Format(time.RFC3339)
	}
	return scope
}

// printVerification prints what a verification counted and found, and returns its verdict: nil when intact,
// exit 1 when broken or stalled, exit 2 when an operation has no records to check.
func printVerification(w io.Writer, f verifyFlags, v verification, interval time.Duration) error {
	rep := v.rep
	fmt.Fprintf(w, "checked %d records of %d operations and approvals: %d sealed, by %d seals; %d not sealed yet\n",
		rep.Records, rep.Subjects, rep.Sealed, rep.Seals, rep.Unsealed)
	fmt.Fprintf(w, "signatures: %s\n", v.keyNote)
	if s := rep.LastSeal; s != nil {
		fmt.Fprintf(w, "last seal: %d at %s, hash %s\n", s.Seq, s.At.UTC().Format(time.RFC3339), s.Hash)
	}
	if !rep.OldestUnsealed.IsZero() {
		fmt.Fprintf(w, "oldest unsealed record: written at %s\n", rep.OldestUnsealed.UTC().Format(time.RFC3339Nano))
		if f.bundle != "" {
			fmt.Fprintf(w, "note: no seal vouches for the %d records not sealed yet: they are as the bundle has them\n", rep.Unsealed)
		}
	}
	if f.operation != "" && rep.Records == 0 && rep.Intact() {
		return exitError{code: 2, err: fmt.Errorf("audit verify: operation %s has no records", f.operation)}
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "BROKEN %s\n", p)
	}
	stalled := rep.Stalled(v.readAt, interval)
	if stalled {
		fmt.Fprintf(w, "STALLED: a record has waited more than 10 seal intervals (%s) to be sealed%s: is a sequencer running, "+
			"and is no transaction held open that long?\n", 10*interval, v.readWhen)
	}
	switch {
	case !rep.Intact():
		return exitError{code: 1, err: fmt.Errorf("audit verify: %d problems", len(rep.Problems))}
	case stalled:
		return exitError{code: 1, err: errors.New("audit verify: sealing has stalled")}
	}
	fmt.Fprintln(w, "INTACT")
	return nil
}

func verifyBundle(f verifyFlags, pub ed25519.PublicKey) (audit.BundleReport, error) {
	file, err := os.Open(f.bundle)
	if err != nil {
		return audit.BundleReport{}, fmt.Errorf("audit verify: %w", err)
	}
	defer file.Close()
	return audit.VerifyBundle(file, audit.BundleOptions{PublicKey: pub, Seal: f.seal})
}

// runAuditExport writes a bundle to stdout: the operator redirects it to a file and hands it to an auditor, who
// checks it with `audit verify --bundle`.
func runAuditExport(ctx context.Context, inv invocation) error {
	opt, err := parseExportFlags(inv.args[1:], inv.stdout)
	if err != nil {
		return err
	}
	if inv.cfg.AuditSigningKey != nil {
		opt.PublicKey = inv.cfg.AuditSigningKey.PublicKey()
	}
	db, err := openAuditPool(inv.cfg)
	if err != nil {
		return exitError{code: 2, err: err}
	}
	if err := audit.Export(ctx, db, opt, inv.stdout); err != nil {
		return exitError{code: 2, err: err}
	}
	return nil
}

// verifyJournal checks an agent's journal (pkg/agent) with the same chain code, same exit codes.
func verifyJournal(w io.Writer, path string) error {
	rep, err := agent.VerifyJournal(path)
	if err != nil {
		return exitError{code: 2, err: err}
	}
	fmt.Fprintf(w, "checked journal %s: %d chain, %d records\n", path, rep.Chains, rep.Records)
	if rep.TornBytes > 0 {
		fmt.Fprintf(w, "note: an unfinished last line (%d bytes, a write that never completed) is outside the chain\n", rep.TornBytes)
	}
	if rep.Intact() {
		fmt.Fprintln(w, "INTACT")
		return nil
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "BROKEN %s\n", p)
	}
	return exitError{code: 1, err: fmt.Errorf("audit verify: journal %s: %d broken chains", path, len(rep.Problems))}
}

// runAuditTimeline prints an operation's timeline for a person: aligned columns, times relative to the first
// attempt. It reads any account's operation: it is an operator's tool, run with database access.
func runAuditTimeline(ctx context.Context, inv invocation, operationID string) error {
	db, err := openAuditPool(inv.cfg)
	if err != nil {
		return exitError{code: 2, err: err}
	}
	// The one lookup by id alone (the operator knows the operation, not its account): a scan of every account,
	// on a sharded database a query of every shard. All that follows is addressed by account and id.
	account, err := opstore.AccountOf(ctx, db, operationID)
	if err != nil {
		return exitError{code: 2, err: fmt.Errorf("audit timeline: %w", err)}
	}
	if account == "" {
		return exitError{code: 1, err: fmt.Errorf("audit timeline: no operation %s", operationID)}
	}
	tl, err := opstatus.GetTimeline(ctx, db, account, operationID)
	if err != nil {
		return exitError{code: 2, err: fmt.Errorf("audit timeline: %w", err)}
	}
	printTimeline(inv.stdout, tl)
	if !tl.Chain.Intact {
		return exitError{code: 1, err: fmt.Errorf("audit timeline: the records of %s are broken", operationID)}
	}
	return nil
}

func printTimeline(out io.Writer, tl opstatus.Timeline) {
	printTimelineHeader(out, tl)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TIME\tSEQ\tWHAT\tTYPE\tATTEMPT\tAGENT RUN\tRETRY OF\tREASON\tSAME REQUEST\tOUTCOME\tSTATUS\tTOOK\tSTATE\tACTOR")
	for _, e := range tl.Entries {
		fmt.Fprintln(w, strings.Join(timelineRow(e, tl.Start), "\t"))
	}
	w.Flush()
	for _, a := range tl.Approvals {
		printTimelineApproval(out, a, tl.Start)
	}
}

// printTimelineHeader prints what the operation is, how it settled, its lineage and whether its records are
// intact.
func printTimelineHeader(out io.Writer, tl opstatus.Timeline) {
	settled := "not settled"
	if tl.SettledBy != nil {
		settled = fmt.Sprintf("settled by %s at %s", *tl.SettledBy, offset(tl.SettledAt.Sub(tl.Start)))
	}
	fmt.Fprintf(out, "operation %s (%s, Idempotency-Key %q): %s, %s\n", tl.OperationID, tl.Kind, tl.IdempotencyKey, tl.State, settled)
	if tl.Supersedes != nil {
		fmt.Fprintf(out, "supersedes %s\n", *tl.Supersedes)
	}
	for _, by := range tl.SupersededBy {
		fmt.Fprintf(out, "superseded by %s\n", by)
	}
	chain := "INTACT"
	if !tl.Chain.Intact {
		chain = "BROKEN: " + strings.Join(tl.Chain.Problems, "; ")
	}
	fmt.Fprintf(out, "records: %s (%d records: %d sealed by %d seals, %d not sealed yet)\n", chain, tl.Chain.Records,
		tl.Chain.Sealed, tl.Chain.Seals, tl.Chain.Unsealed)
	fmt.Fprintf(out, "times are relative to the first attempt, at %s\n\n", tl.Start.UTC().Format(time.RFC3339Nano))
}

// timelineRow is one entry's cells, in the columns printTimeline heads them with; "-" where it has no value.
func timelineRow(e opstatus.TimelineEntry, start time.Time) []string {
	attempt, status, took, same, state := "-", "-", "-", "-", "-"
	if e.Attempt != nil {
		attempt = fmt.Sprintf("#%d %s", *e.Attempt, e.AttemptID)
	} else if e.AttemptID != "" {
		attempt = e.AttemptID
	}
	if e.Status != nil {
		status = fmt.Sprint(*e.Status)
	}
	if e.DurationMS != nil {
		took = fmt.Sprintf("%dms", *e.DurationMS)
	}
	if e.SameFingerprint != nil {
		same = map[bool]string{true: "yes", false: "NO"}[*e.SameFingerprint]
	}
	if e.ToState != "" {
		state = fmt.Sprintf("%s -> %s", orDash(string(e.FromState)), e.ToState)
	}
	reason := orDash(e.RetryReason)
	if e.Reason != "" {
		reason = e.Reason
	}
	return []string{offset(e.At.Sub(start)), fmt.Sprint(e.Seq), e.Category, e.Type, attempt, orDash(e.AgentRunID),
		orDash(e.RetryOf), reason, same, orDash(e.Outcome), status, took, state, e.Actor}
}

// printTimelineApproval prints an approval the timeline shows, and its records.
func printTimelineApproval(out io.Writer, a opstatus.TimelineApproval, start time.Time) {
	decided := "undecided"
	if a.DecidedBy != nil && a.DecidedAt != nil {
		decided = fmt.Sprintf("%s by %s at %s", a.State, *a.DecidedBy, offset(a.DecidedAt.Sub(start)))
	}
	fmt.Fprintf(out, "approval %s: requested by %s at %s, %s, used by attempt %s\n", a.ApprovalID, a.RequestedBy,
		offset(a.RequestedAt.Sub(start)), decided, orDash(a.UsedByAttempt))
	recs := make([]string, 0, len(a.Records))
	for _, r := range a.Records {
		recs = append(recs, fmt.Sprintf("%d %s by %s at %s", r.Seq, r.Type, r.Actor, offset(r.At.Sub(start))))
	}
	if len(recs) > 0 {
		fmt.Fprintf(out, "  records: %s\n", strings.Join(recs, "; "))
	}
}

// orDash is s, or "-" when it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// offset renders a time relative to the first attempt: +1.234s, or -0.500s for what came before it.
func offset(d time.Duration) string {
	sign := "+"
	if d < 0 {
		sign, d = "-", -d
	}
	return fmt.Sprintf("%s%d.%03ds", sign, int64(d/time.Second), int64(d%time.Second/time.Millisecond))
}
