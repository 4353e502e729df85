package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/retrysafe/retrysafe/pkg/auditchain"
	"github.com/retrysafe/retrysafe/pkg/ids"
)

// ErrJournalBroken is returned by Open when the journal's chain does not verify: an agent never acts on it.
var ErrJournalBroken = errors.New("agent: the journal's hash chain is broken")

// ErrJournalLocked is returned by Open when another process holds the journal for longer than Config.LockWait.
var ErrJournalLocked = errors.New("agent: the journal is in use by another agent process")

// ErrNotJournal is returned by Open for a path that is not a journal: a symbolic link, something other than a
// regular file, an empty file, or a file whose first line is not a journal record. The file is left as it is.
var ErrNotJournal = errors.New("agent: not a journal")

// Record types of the journal, in the order an operation's story usually runs.
const (
	RecJournalOpened     = "journal_opened"
	RecRunStarted        = "run_started"
	RecOperationCreated  = "operation_created"
	RecAttemptStarted    = "attempt_started"
	RecAttemptFinished   = "attempt_finished"
	RecObservation       = "observation"
	RecOperationSettled  = "operation_settled"
	RecIntentRefused     = "changed_intent_refused"
	RecTornTailDiscarded = "torn_tail_discarded"
	RecPrincipalAdopted  = "principal_adopted"
)

// recordStart is how every journal line begins (entry's first field, and the prefix of every chain name): a
// torn tail is a prefix of a line, so it begins so too, or is shorter than this.
const recordStart = `{"chain":"jnl_`

// entry is one line of the journal file: an auditchain record (the server's format) as JSON.
type entry struct {
	Chain  string          `json:"chain"`
	Seq    int64           `json:"seq"`
	Prev   string          `json:"prev"`
	Hash   string          `json:"hash"`
	Record json.RawMessage `json:"record"`
}

// journal is the append-only, hash-chained file. Every record is one line written with one write(2) and made
// durable with fsync before the caller acts on it: a record the agent relies on (an operation and its key,
// "attempt started") exists on disk before the request leaves the process.
type journal struct {
	path string
	f    *os.File

	chain *auditchain.Chain
	recs  []json.RawMessage
	now   func() time.Time
}

// openJournal opens (creating) and locks the journal at path, waiting up to wait for another process to let go.
// The lock is an flock(2) on the file itself: the kernel drops it when the holder dies, even by SIGKILL.
//
// The journal is opened without following a symbolic link, and must be a regular file: an agent appends to it
// and truncates a torn last line, which must never happen to a file the link points at. A new journal appears
// whole, with its first record (createJournal), so a file an agent did not write, an empty one included, is
// refused and left as it is. The journal holds every call's arguments and decides what resume sends: it is
// kept to mode 0600, like a file holding a secret; a journal others could read or write is made 0600, with a
// warning, or refused when this process may not change its mode.
func openJournal(path string, wait time.Duration, now func() time.Time, warn func(string)) (*journal, error) {
	if st, err := os.Lstat(path); err == nil && !st.Mode().IsRegular() {
		return nil, notRegular(path, st.Mode())
	}
	if err := createJournal(path, now()); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, notRegular(path, os.ModeSymlink)
	}
	if err != nil {
		return nil, fmt.Errorf("agent: open journal: %w", err)
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = notRegular(path, st.Mode())
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := lockFile(f, wait); err != nil {
		f.Close()
		return nil, err
	}
	j := &journal{path: path, f: f, now: now}
	if err := j.load(); err != nil {
		f.Close()
		return nil, err
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		if err := f.Chmod(perm &^ 0o077); err != nil {
			f.Close()
			return nil, fmt.Errorf("agent: journal %s is mode %04o, open to others, and cannot be made 0600 (%w): "+
				"whoever can write it can change what resume sends; chmod go-rwx it", path, perm, err)
		}
		warn(fmt.Sprintf("agent: journal %s could be read or written by others (mode %04o): whoever can write it can "+
			"change what resume sends; it is now mode %04o", path, perm, perm&^0o077))
	}
	return j, nil
}

// createJournal makes a new journal at path whole: its first record is written and fsynced in a temporary file
// (mode 0600) beside it, which is then hard-linked to path. A journal never exists without its first record, so
// an agent never leaves an empty file, and an empty file is never taken for a journal. When path already
// exists (another process may have created it a moment ago) it does nothing: Open reads what is there.
func createJournal(path string, now time.Time) error {
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		return nil // there, or unreadable: opening it says which
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".new-*")
	if err != nil {
		return fmt.Errorf("agent: create journal: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	chain := &auditchain.Chain{Name: ids.New("jnl_")}
	line, _, err := chainLine(chain, map[string]any{"type": RecJournalOpened, "at": auditchain.FormatTime(now), "format": 1})
	if err != nil {
		return err
	}
	if _, err := tmp.Write(line); err != nil {
		return fmt.Errorf("agent: create journal: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("agent: create journal: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("agent: create journal: %w", err)
	}
	// The new name is durable once its directory is.
	if d, err := os.Open(dir); err == nil {
		defer d.Close()
		if err := d.Sync(); err != nil {
			return fmt.Errorf("agent: create journal: %w", err)
		}
	}
	return nil
}

func notRegular(path string, mode os.FileMode) error {
	what := "not a regular file"
	if mode&os.ModeSymlink != 0 {
		what = "a symbolic link; name the journal file itself"
	}
	return fmt.Errorf("%w: %s is %s", ErrNotJournal, path, what)
}

func lockFile(f *os.File, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("agent: lock journal: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w (%s); wait for it to finish or use another journal", ErrJournalLocked, f.Name())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// load reads the records, discards an unfinished last line (a write the kernel never completed: nothing was
// acted on after it, because every record is fsynced before the agent acts), and resumes the chain.
func (j *journal) load() error {
	entries, tail, err := readEntries(j.f)
	if err != nil {
		return err
	}
	torn := len(tail)
	if torn > 0 && !bytes.HasPrefix(tail, []byte(recordStart)) && !bytes.HasPrefix([]byte(recordStart), tail) {
		// Not the start of a record: bytes an agent never wrote, perhaps the whole file. Never truncated.
		return fmt.Errorf("%w: %s ends with %d bytes that are not a journal record; the file was left as it is",
			ErrNotJournal, j.path, torn)
	}
	if rep := verifyEntries(entries); !rep.Intact() {
		// Resume would act on what the journal says: not on a journal that was changed.
		return fmt.Errorf("%w: %s (retrysafe audit verify --journal %s)", ErrJournalBroken, rep.Problems[0], j.path)
	}
	for _, e := range entries {
		j.recs = append(j.recs, e.Record)
	}
	if torn > 0 {
		st, err := j.f.Stat()
		if err != nil {
			return fmt.Errorf("agent: journal: %w", err)
		}
		if err := j.f.Truncate(st.Size() - int64(torn)); err != nil {
			return fmt.Errorf("agent: journal: discard unfinished line: %w", err)
		}
	}
	if len(entries) == 0 && torn == 0 {
		return fmt.Errorf("%w: %s is empty, and an agent never leaves a journal empty; the file was left as it is "+
			"(remove it, or name a path where none exists)", ErrNotJournal, j.path)
	}
	if len(entries) == 0 {
		// A torn first record, which agents that created the file before writing to it could leave.
		j.chain = &auditchain.Chain{Name: ids.New("jnl_")}
		if _, err := j.append(map[string]any{"type": RecJournalOpened, "at": auditchain.FormatTime(j.now()), "format": 1}); err != nil {
			return err
		}
	} else {
		last := entries[len(entries)-1]
		j.chain = auditchain.Resume(auditchain.Head{Chain: last.Chain, Seq: last.Seq, Hash: last.Hash})
	}
	if torn > 0 {
		_, err := j.append(map[string]any{"type": RecTornTailDiscarded, "at": auditchain.FormatTime(j.now()), "bytes": torn})
		return err
	}
	return nil
}

// readEntries parses every complete line of r; tail is a last line without its newline. A first line that is
// not a record is ErrNotJournal: the file is something else.
func readEntries(r io.ReaderAt) (entries []entry, tail []byte, err error) {
	data, err := io.ReadAll(io.NewSectionReader(r, 0, 1<<40))
	if err != nil {
		return nil, nil, fmt.Errorf("agent: read journal: %w", err)
	}
	if i := bytes.LastIndexByte(data, '\n'); i < len(data)-1 {
		tail = data[i+1:]
		data = data[:i+1]
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 64*1024*1024)
	line := 0
	for sc.Scan() {
		line++
		var e entry
		err := json.Unmarshal(sc.Bytes(), &e)
		switch {
		case line == 1 && (err != nil || !bytes.HasPrefix(sc.Bytes(), []byte(recordStart))):
			return nil, nil, fmt.Errorf("%w: its first line is not a journal record; the file was left as it is", ErrNotJournal)
		case err != nil:
			return nil, nil, fmt.Errorf("agent: journal line %d is not a record: %w", line, err)
		}
		entries = append(entries, e)
	}
	return entries, tail, sc.Err()
}

// append chains body as the next record, writes it as one line and fsyncs. The Agent's mu must be held, or j not
// shared yet.
func (j *journal) append(body any) (json.RawMessage, error) {
	line, rec, err := chainLine(j.chain, body)
	if err != nil {
		return nil, err
	}
	if _, err := j.f.Write(line); err != nil {
		return nil, fmt.Errorf("agent: journal write: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		return nil, fmt.Errorf("agent: journal fsync: %w", err)
	}
	j.recs = append(j.recs, rec)
	return rec, nil
}

// chainLine chains body as the next record of c and returns its journal line, newline included, and the body.
func chainLine(c *auditchain.Chain, body any) (line []byte, rec json.RawMessage, err error) {
	r, err := c.Append(body)
	if err != nil {
		return nil, nil, err
	}
	line, err = json.Marshal(entry{Chain: r.Chain, Seq: r.Seq, Prev: r.Prev, Hash: r.Hash, Record: r.Body})
	if err != nil {
		return nil, nil, err
	}
	return append(line, '\n'), r.Body, nil
}

func (j *journal) close() error {
	// Closing the descriptor releases the flock.
	return j.f.Close()
}

// ReadRecords returns the journal's record bodies in order, without taking the lock: appends are whole lines,
// and an unfinished last line is left out.
func ReadRecords(path string) ([]json.RawMessage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	defer f.Close()
	entries, _, err := readEntries(f)
	if err != nil {
		return nil, err
	}
	out := make([]json.RawMessage, len(entries))
	for i, e := range entries {
		out[i] = e.Record
	}
	return out, nil
}
