package dedup

import "errors"

// ErrTxOwned is returned by Commit and Rollback of a transaction dedup gives
// a handler and ends itself: a TxHandler's in a batch (the transaction holds
// the batch's other events too) and idemhttp's transactional handler's (the
// middleware commits it with the stored response).
var ErrTxOwned = errors.New("dedup: the handler must neither commit nor roll back its transaction; dedup ends it")

// ErrTxAborted is matched by the failure of a transactional handler that
// succeeded (a TxHandler returning nil, a front end's Complete) after a
// statement of its transaction failed, which aborted it: its writes cannot
// commit, so they are rolled back and the attempt is recorded as failed.
var ErrTxAborted = errors.New("dedup: a failed statement aborted the transaction")
