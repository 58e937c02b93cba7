package dedup

import "errors"

// ErrTxOwned is returned by Commit and Rollback of a transaction dedup gives
// a handler and ends itself: a TxHandler's in a batch (the transaction holds
// the batch's other events too) and idemhttp's transactional handler's (the
// middleware commits it with the stored response).
var ErrTxOwned = errors.New("dedup: the handler must neither commit nor roll back its transaction; dedup ends it")
