// Package natsx is what every NATS user in Infera shares: the worker token
// that names a worker in subjects and bucket keys (URL-safe base64 of its
// id, no padding) and the connection: URL resolution (--nats-server, else
// NATS_SERVER, else nats://127.0.0.1:4222), credentials (in the URL, a
// creds or nkey file, a TLS CA) and a connect that fails once and clearly
// at start-up, then reconnects forever.
//
// Concurrency: the functions are safe for concurrent use; a *nats.Conn is
// too.
package natsx
