// Package deduptype holds the types that package dedup, its stores, its
// transport adapters and its front ends share, and the kit a store author
// needs. It imports nothing of this module, so any of them may import it.
//
// # Which package to name
//
// A user of dedup names none of this package: package dedup declares an
// alias for every name a user's code needs (dedup.Key, dedup.Record,
// dedup.Outcome, dedup.Result, dedup.Reason, dedup.ErrLeaseLost, ...), and
// errors.Is and errors.As match either name, since both name one value.
//
// An adapter, a front end or an internal package that must not import the
// wrapper (a producer, a shared configuration) names the shared vocabulary
// here: [Outcome] and [Result], [Reason], the sentinel errors such as
// [ErrConfig] and [ErrOutage].
//
// A store author implements dedup.Store with the types declared here:
// [ClaimRequest], [Claim] and its [ClaimStatus], [Failure], [Key] and
// [Record]. What only a store needs lives here alone: [Classify] answers a
// refused claim from the record that blocked it, [MayTakeOver] decides a
// takeover in the claim's atomic write, [ValidateBatch] and
// [ValidateCompletions] check a batch before anything is written,
// [NewOwnerToken] and [NewOwnerTokens] make claims' owner tokens, and a
// store that can complete several records in one write implements
// [BatchCompleter] over [Completion] values. The deduptest package checks
// a store against the contract.
package deduptype
