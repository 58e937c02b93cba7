// Package deps holds the test that checks the module's import graph against
// the rules of its layout (CONTRIBUTING.md, "Packages and their edges"):
// the publishers import no consumer adapter, no internal package imports
// the root, the root imports only deduptype and internal packages, and
// deduptype and internal/wire import nothing of the module. It imports
// nothing and holds no code, so that its test builds and names the
// offending edge even when an import cycle keeps the packages it checks
// from building.
package deps
