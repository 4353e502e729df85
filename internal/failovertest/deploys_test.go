package failovertest

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// followUp is a deploy planned on the environment version a lost deploy made: its client saw that deploy
// succeed, and deploys again without sending the lost one again.
type followUp struct {
	w       *write
	after   string // the lost deploy's id
	version int64  // the version the lost deploy made, as the target's marker says
}

// catchUps sends, before anything is sent again, a follow-up deploy to the environment of every lost deploy that
// the target (whose database did not fail over) had activated, expecting the version its marker records. The
// environment, behind in our database, catches up with the marker and the follow-up is accepted, never refused
// environment_version_mismatch. The follow-ups join their jobs' writes, and are sent again with them.
func catchUps(t *testing.T, s *stack, d *driver, lost map[*write]bool) []followUp {
	t.Helper()
	var out []followUp
	d.mu.Lock()
	jobs := append([]*job(nil), d.jobs...)
	d.mu.Unlock()
	for _, j := range jobs {
		w := j.writes[0]
		if w.kind != kindDeploy || !lost[w] {
			continue
		}
		ack, _ := w.acked()
		var marker struct {
			Environment string
			Version     int64
		}
		err := s.target.QueryRow(t.Context(), `SELECT environment, environment_version FROM deploy_target_activations WHERE deploy_id = $1`,
			answerID(ack)).Scan(&marker.Environment, &marker.Version)
		if err == pgx.ErrNoRows {
			continue // never activated: its retry runs it
		}
		if err != nil {
			t.Fatal(err)
		}
		next := &write{kind: kindDeploy, key: w.key + "-next", body: fmt.Sprintf(
			`{"service":"web","environment":%q,"commit_sha":"%040x","expected_environment_version":%d}`, marker.Environment, j.n, marker.Version)}
		res := d.send(next, "/v1/deploys")
		if res == nil || res.Code != http.StatusAccepted {
			t.Errorf("%s, planned on version %d that lost deploy %s made: %s; want 202 (caught up with the target)",
				next.key, marker.Version, answerID(ack), describe(res))
			continue
		}
		d.mu.Lock()
		j.writes = append(j.writes, next)
		d.mu.Unlock()
		out = append(out, followUp{w: next, after: answerID(ack), version: marker.Version})
	}
	return out
}

// aheadOfLost checks, once every deploy has finished, each environment a follow-up caught up: the follow-up made
// the version after the lost deploy's and is current, and the lost deploy, sent again under its key, was
// adopted from the target's marker (succeeded, activated once) without moving the environment back. It returns
// how many lost deploys were adopted.
func aheadOfLost(t *testing.T, s *stack, db *pgx.Conn, followUps []followUp) int {
	t.Helper()
	adopted := 0
	for _, f := range followUps {
		id := answerID(f.w.last)
		var env struct {
			Version int64
			Current string
		}
		if err := db.QueryRow(t.Context(), `SELECT e.version, e.current_deploy_id FROM environments e JOIN deploys d
ON d.account_id = e.account_id AND d.environment = e.name WHERE d.id = $1`, id).Scan(&env.Version, &env.Current); err != nil {
			t.Fatal(err)
		}
		if env.Version != f.version+1 || env.Current != id {
			t.Errorf("%s: the environment is at version %d, deploy %s; want %d, deploy %s", f.w.key, env.Version, env.Current, f.version+1, id)
		}
		var lost struct {
			State string
			Calls int
		}
		if err := db.QueryRow(t.Context(), `SELECT state FROM deploys WHERE id = $1`, f.after).Scan(&lost.State); err != nil {
			t.Fatalf("lost deploy %s after its retry: %v", f.after, err)
		}
		if err := s.target.QueryRow(t.Context(), `SELECT calls FROM deploy_target_activations WHERE deploy_id = $1`, f.after).Scan(&lost.Calls); err != nil {
			t.Fatal(err)
		}
		switch {
		case lost.State != "succeeded" || lost.Calls != 1:
			t.Errorf("lost deploy %s after its retry: %s, %d activation calls; want succeeded, adopted from the marker (1 call)", f.after, lost.State, lost.Calls)
		default:
			adopted++
		}
	}
	return adopted
}

// activatedSince counts the deploys first acknowledged after since that the target has activated.
func activatedSince(t *testing.T, s *stack, d *driver, since time.Time) int {
	t.Helper()
	var ids []string
	for _, w := range d.writes() {
		if ack, at := w.acked(); w.kind == kindDeploy && ack != nil && at.After(since) {
			ids = append(ids, answerID(ack))
		}
	}
	return count(t, s.target, `SELECT count(*) FROM deploy_target_activations WHERE deploy_id = ANY($1)`, ids)
}
