package transport_test

import (
	"context"
	"fmt"
	"net"

	"github.com/infera/infera/transport"
)

// The prefill/decode hand-off over TCP: the prefill side serves a
// request's KV under the request id and publishes its Desc; the decode side
// parses the Desc and reads the bytes into its own registered memory.
func Example_prefillDecode() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	prefill, _ := transport.NewTCP(transport.TCPConfig{Listener: ln})
	defer func() { _ = prefill.Close() }()
	decode, _ := transport.NewTCP(transport.TCPConfig{})
	defer func() { _ = decode.Close() }()

	// Prefill: the KV blocks of request 42, served until decode is done.
	kv, _ := prefill.Register("req-42", []byte("kv blocks of request 42"))
	published, _ := kv.Desc().MarshalText() // e.g. into kv_transfer_params

	// Decode: read the whole region into a registered buffer.
	var remote transport.Desc
	if err := remote.UnmarshalText(published); err != nil {
		panic(err)
	}
	local, _ := decode.Register("req-42/dst", make([]byte, remote.Len))
	err = transport.Transfer(context.Background(), decode, []transport.Op{
		{Kind: transport.Read, Local: local, Remote: remote, Len: remote.Len},
	})
	fmt.Println(string(local.Bytes()), err)

	// Prefill frees the blocks once decode reports the read.
	_ = prefill.Deregister(kv)
	// Output: kv blocks of request 42 <nil>
}
