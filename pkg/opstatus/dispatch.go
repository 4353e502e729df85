package opstatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"gorm.io/gorm"
)

// lastDispatchSQL reads the type of an operation's newest dispatch record: dispatch_started while its call is
// out, the Dispatch* event of what the caller observed once it ended (index operation_events_operation).
const lastDispatchSQL = `SELECT type FROM operation_events
WHERE account_id = ? AND operation_id = ? AND type LIKE 'dispatch\_%'
ORDER BY id DESC LIMIT 1`

// CallOver reads the operation's own dispatch records and returns the record that shows its call to the other
// side is over, or "" when the call may still be in flight: dispatch_response_received (an answer came back,
// whatever its status) or dispatch_not_sent (nothing left the process) as the newest dispatch record. A
// dispatch_started with nothing after it, a dispatch_sent_no_response, or no record at all (the finish could
// not be written) leave the call possibly in flight: only the lease bounds it then.
func CallOver(ctx context.Context, db *gorm.DB, accountID, id string) (string, error) {
	var types []string
	if err := db.WithContext(ctx).Raw(lastDispatchSQL, accountID, id).Scan(&types).Error; err != nil {
		return "", fmt.Errorf("opstatus: dispatch records of %s: %w", id, err)
	}
	if len(types) == 1 && (types[0] == EventDispatchResponseReceived || types[0] == EventDispatchNotSent) {
		return types[0], nil
	}
	return "", nil
}

// ErrNotRunning is StartDispatch's refusal: the operation is no longer running (settled, marked unknown, or its
// claim released because its owner is gone), so its call must not be sent.
var ErrNotRunning = errors.New("opstatus: the operation is not running")

// startDispatchSQL appends dispatch_started only while the operation is running. FOR SHARE makes it wait for a
// transaction that holds the operation's row (a release under the row lock, OwnerGone) and then see the state
// that one committed: a release and a dispatch never both go through.
const startDispatchSQL = `WITH op AS (
    SELECT id, account_id FROM operations WHERE account_id = ? AND id = ? AND state = 'running' FOR SHARE
)
INSERT INTO operation_events (operation_id, account_id, type, actor, detail)
SELECT op.id, op.account_id, ?, ?, ?::jsonb FROM op`

// StartDispatch commits the dispatch_started record of a call that leaves the process, before the call is
// written, or returns an error matching ErrNotRunning when the operation is no longer running: the caller must
// then not send it (provider.DispatchObserver.Started's contract).
func StartDispatch(ctx context.Context, db *gorm.DB, accountID, id, actor string, detail any) error {
	raw, err := json.Marshal(detail)
	if err != nil {
		return fmt.Errorf("opstatus: dispatch of %s: detail: %w", id, err)
	}
	res := db.WithContext(ctx).Exec(startDispatchSQL, accountID, id, EventDispatchStarted, actor, string(raw))
	if res.Error != nil {
		return fmt.Errorf("opstatus: dispatch of %s: %w", id, res.Error)
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("opstatus: dispatch of %s: %w", id, ErrNotRunning)
	}
	return nil
}
