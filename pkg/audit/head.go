package audit

import (
	"github.com/jackc/pgx/v5"
)

// StartOperationChain links events as the first records of a new operation's chain (NewOperationChain) and
// queues the insert of the chain's head on b, for a writer that inserts the operation and these records in the
// same transaction: the chaining trigger then has nothing to do for them. The head's insert fails if the chain
// exists, so these links can only ever start a chain. The writer stores each event with its link.
func StartOperationChain(b *pgx.Batch, accountID string, events []OperationEvent, attempts []bool) ([]Link, error) {
	links, n, err := NewOperationChain(events, attempts)
	if err != nil {
		return nil, err
	}
	last := links[len(links)-1]
	b.Queue(`INSERT INTO audit_chain_heads (account_id, chain, seq, hash, prev_hash, attempts) VALUES ($1, $2, $3, $4, $5, $6)`,
		accountID, events[0].OperationID, last.Seq, last.Hash, last.PrevHash, n)
	return links, nil
}
