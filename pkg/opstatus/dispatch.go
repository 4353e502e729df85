package opstatus

import (
	"context"
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
