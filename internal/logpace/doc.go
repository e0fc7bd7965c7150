// Package logpace paces a repeated warning: at most one line a period,
// that line saying how many were left out since the one before, so a
// flood of the same event (refused connections, clients over their
// limits, an etcd member that stopped answering) cannot flood the log
// while the count of what was left out is kept.
//
// Concurrency: a Pacer is safe for concurrent use; its zero value is
// ready (the first line is always logged).
package logpace
