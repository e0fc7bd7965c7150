package resp

import "strings"

// command is one entry of the command table: what COMMAND reports
// (Redis 7.0's shape) and how the dispatcher checks arity and auth.
type command struct {
	name     string // full name, "client|setname" for a subcommand
	arity    int    // > 0 exact, < 0 at least -arity (command name included)
	flags    []string
	first    int // legacy key range
	last     int
	step     int
	acl      []string
	keySpecs []keySpec
	subs     []*command
	noAuth   bool
	id       cmdID
}

type keySpec struct {
	flags   []string
	index   int // begin_search index
	lastkey int // find_keys range
	keystep int
}

type cmdID uint8

const (
	cmdUnknown cmdID = iota
	cmdGet
	cmdSet
	cmdMGet
	cmdMSet
	cmdExists
	cmdDel
	cmdPing
	cmdEcho
	cmdAuth
	cmdHello
	cmdSelect
	cmdInfo
	cmdDBSize
	cmdQuit
	cmdClient
	cmdClientSetName
	cmdClientSetInfo
	cmdClientGetName
	cmdClientID
	cmdCommand
	cmdCommandCount
	cmdCommandInfo
	cmdCommandDocs
	cmdConfig
	cmdConfigGet
)

var (
	fastConn   = []string{"@fast", "@connection"}
	noAuthFlag = []string{"noscript", "loading", "stale", "fast", "no_auth", "allow_busy"}
	roKey      = keySpec{flags: []string{"RO", "access"}, index: 1, lastkey: 0, keystep: 1}
)

var commandTable = []*command{
	{name: "get", arity: 2, flags: []string{"readonly", "fast"}, first: 1, last: 1, step: 1, acl: []string{"@read", "@string", "@fast"}, keySpecs: []keySpec{roKey}, id: cmdGet},
	{name: "set", arity: -3, flags: []string{"write", "denyoom"}, first: 1, last: 1, step: 1, acl: []string{"@write", "@string", "@slow"},
		keySpecs: []keySpec{{flags: []string{"RW", "access", "update", "variable_flags"}, index: 1, lastkey: 0, keystep: 1}}, id: cmdSet},
	{name: "mget", arity: -2, flags: []string{"readonly", "fast"}, first: 1, last: -1, step: 1, acl: []string{"@read", "@string", "@fast"},
		keySpecs: []keySpec{{flags: []string{"RO", "access"}, index: 1, lastkey: -1, keystep: 1}}, id: cmdMGet},
	{name: "mset", arity: -3, flags: []string{"write", "denyoom"}, first: 1, last: -1, step: 2, acl: []string{"@write", "@string", "@slow"},
		keySpecs: []keySpec{{flags: []string{"OW", "update"}, index: 1, lastkey: -1, keystep: 2}}, id: cmdMSet},
	{name: "exists", arity: -2, flags: []string{"readonly", "fast"}, first: 1, last: -1, step: 1, acl: []string{"@keyspace", "@read", "@fast"},
		keySpecs: []keySpec{{flags: []string{"RO"}, index: 1, lastkey: -1, keystep: 1}}, id: cmdExists},
	{name: "del", arity: -2, flags: []string{"write"}, first: 1, last: -1, step: 1, acl: []string{"@keyspace", "@write", "@slow"},
		keySpecs: []keySpec{{flags: []string{"RM", "delete"}, index: 1, lastkey: -1, keystep: 1}}, id: cmdDel},
	{name: "ping", arity: -1, flags: []string{"fast"}, acl: fastConn, id: cmdPing},
	{name: "echo", arity: 2, flags: []string{"fast"}, acl: fastConn, id: cmdEcho},
	{name: "auth", arity: -2, flags: noAuthFlag, acl: fastConn, noAuth: true, id: cmdAuth},
	{name: "hello", arity: -1, flags: noAuthFlag, acl: fastConn, noAuth: true, id: cmdHello},
	{name: "select", arity: 2, flags: []string{"loading", "stale", "fast"}, acl: fastConn, id: cmdSelect},
	{name: "info", arity: -1, flags: []string{"loading", "stale"}, acl: []string{"@slow", "@dangerous"}, id: cmdInfo},
	{name: "dbsize", arity: 1, flags: []string{"readonly", "fast"}, acl: []string{"@keyspace", "@read", "@fast"}, id: cmdDBSize},
	{name: "quit", arity: -1, flags: []string{"allow_busy", "noscript", "loading", "stale", "fast", "no_auth"}, acl: fastConn, noAuth: true, id: cmdQuit},
	{name: "client", arity: -2, acl: []string{"@slow"}, id: cmdClient, subs: []*command{
		{name: "client|setname", arity: 3, flags: []string{"noscript", "loading", "stale"}, acl: []string{"@slow", "@connection"}, id: cmdClientSetName},
		{name: "client|setinfo", arity: 4, flags: []string{"noscript", "loading", "stale"}, acl: []string{"@slow", "@connection"}, id: cmdClientSetInfo},
		{name: "client|getname", arity: 2, flags: []string{"noscript", "loading", "stale"}, acl: []string{"@slow", "@connection"}, id: cmdClientGetName},
		{name: "client|id", arity: 2, flags: []string{"noscript", "loading", "stale"}, acl: []string{"@slow", "@connection"}, id: cmdClientID},
	}},
	{name: "command", arity: -1, flags: []string{"loading", "stale"}, acl: []string{"@slow", "@connection"}, id: cmdCommand, subs: []*command{
		{name: "command|count", arity: 2, flags: []string{"loading", "stale"}, acl: []string{"@slow", "@connection"}, id: cmdCommandCount},
		{name: "command|info", arity: -2, flags: []string{"loading", "stale"}, acl: []string{"@slow", "@connection"}, id: cmdCommandInfo},
		{name: "command|docs", arity: -2, flags: []string{"loading", "stale"}, acl: []string{"@slow", "@connection"}, id: cmdCommandDocs},
	}},
	{name: "config", arity: -2, acl: []string{"@slow"}, id: cmdConfig, subs: []*command{
		{name: "config|get", arity: -3, flags: []string{"admin", "noscript", "loading", "stale"}, acl: []string{"@admin", "@slow", "@dangerous"}, id: cmdConfigGet},
	}},
}

// commands indexes the table by lower-case name (subcommands by
// "container|sub").
var commands = func() map[string]*command {
	m := map[string]*command{}
	for _, c := range commandTable {
		m[c.name] = c
		for _, s := range c.subs {
			m[s.name] = s
		}
	}
	return m
}()

func (c *command) container() bool { return len(c.subs) > 0 }

// appendInfo writes c as one COMMAND / COMMAND INFO entry: name, arity,
// flags, first key, last key, step, ACL categories, tips, key specs and
// subcommands (RESP2 renders Redis's sets and maps as arrays).
func appendInfo(b []byte, c *command) []byte {
	b = appendArray(b, 10)
	b = appendBulkString(b, c.name)
	b = appendInt(b, int64(c.arity))
	b = appendArray(b, len(c.flags))
	for _, f := range c.flags {
		b = append(b, '+')
		b = append(b, f...)
		b = append(b, '\r', '\n')
	}
	b = appendInt(b, int64(c.first))
	b = appendInt(b, int64(c.last))
	b = appendInt(b, int64(c.step))
	b = appendStrings(b, c.acl...)
	b = appendArray(b, 0) // tips
	b = appendArray(b, len(c.keySpecs))
	for _, k := range c.keySpecs {
		b = appendArray(b, 6)
		b = appendBulkString(b, "flags")
		b = appendArray(b, len(k.flags))
		for _, f := range k.flags {
			b = append(b, '+')
			b = append(b, f...)
			b = append(b, '\r', '\n')
		}
		b = appendBulkString(b, "begin_search")
		b = appendArray(b, 4)
		b = appendBulkString(b, "type")
		b = appendBulkString(b, "index")
		b = appendBulkString(b, "spec")
		b = appendArray(b, 2)
		b = appendBulkString(b, "index")
		b = appendInt(b, int64(k.index))
		b = appendBulkString(b, "find_keys")
		b = appendArray(b, 4)
		b = appendBulkString(b, "type")
		b = appendBulkString(b, "range")
		b = appendBulkString(b, "spec")
		b = appendArray(b, 6)
		b = appendBulkString(b, "lastkey")
		b = appendInt(b, int64(k.lastkey))
		b = appendBulkString(b, "keystep")
		b = appendInt(b, int64(k.keystep))
		b = appendBulkString(b, "limit")
		b = appendInt(b, 0)
	}
	b = appendArray(b, len(c.subs))
	for _, s := range c.subs {
		b = appendInfo(b, s)
	}
	return b
}

// commandReply is COMMAND's whole answer, built once.
var commandReply = func() []byte {
	b := appendArray(nil, len(commandTable))
	for _, c := range commandTable {
		b = appendInfo(b, c)
	}
	return b
}()

func lookupName(name []byte) *command { return commands[strings.ToLower(string(name))] }
