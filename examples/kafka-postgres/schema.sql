-- Business tables of the payments worker. The dedup table (dedup_records by
-- default) is created by the worker itself (PostgresStore.Migrate).
--
-- Each payment event is applied by the transactional inbox: the row below,
-- the balance update and the dedup record commit in one transaction, so a
-- redelivered event can never be applied twice.

CREATE TABLE IF NOT EXISTS payments (
    event_id   text        PRIMARY KEY,
    account    text        NOT NULL,
    cents      bigint      NOT NULL CHECK (cents > 0),
    topic      text        NOT NULL,
    kpartition integer     NOT NULL,
    koffset    bigint      NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS balances (
    account    text        PRIMARY KEY,
    cents      bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
