package dedup

import "errors"

// ErrTxOwned is returned by Commit and Rollback of a transaction dedup gives
// a handler and ends itself: a TxHandler's in a batch (the transaction holds
// the batch's other events too) and idemhttp's transactional handler's (the
// middleware commits it with the stored response).
var ErrTxOwned = errors.New("dedup: the handler must neither commit nor roll back its transaction; dedup ends it")

// ErrTxAborted is matched by the error of a transactional attempt's
// completion when a statement that failed had aborted its transaction: the
// handler's writes cannot commit, so the transaction was rolled back and
// nothing recorded (the error matches pgx.ErrTxCommitRollback too).
var ErrTxAborted = errors.New("dedup: a failed statement aborted the transaction")
