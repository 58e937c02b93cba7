// Package inmodule holds the token by which dedup's own packages call the
// few exported methods of the root package that are not for users: the
// claims in a caller's transaction that idemhttp's transactional mode is
// built on.
package inmodule

// Token is the first argument after the context of a method only dedup's
// own packages may call: outside the module it can be neither named nor
// built.
type Token struct{ _ [0]func() }
