// Package router owns the front door: the fasthttp OpenAI endpoint, the fleet
// view it routes on, the routing policies, the streaming relay, and metrics.
//
// Concurrency: the fleet view is an immutable value swapped through an atomic
// pointer by the discovery watcher callback; request handlers only load it and
// never lock on the request path. Policies are safe for concurrent use.
package router
