// Package archtest holds TestImportRules, which keeps the "may import"
// table of docs/architecture.md true: it reads the table, lists every
// package's imports with `go list` and fails on an import outside a
// package's row or on a package with no row. It has no non-test code.
package archtest
