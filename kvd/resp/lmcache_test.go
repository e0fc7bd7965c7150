package resp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"sync"
	"testing"

	"github.com/infera/infera/kvd"
)

// LMCache's remote backends, replayed as the bytes they send and checked
// the way they read the replies (LMCache read at its redis_connector.py
// and csrc/storage_backends/redis/connector.cpp).

// lmcacheKey is CacheEngineKey.to_string(): fmt@model@world_size@worker@hash.
func lmcacheKey(worker, chunk int) string {
	return fmt.Sprintf("vllm@meta-llama/Llama-3.1-8B-Instruct@2@%d@%016x", worker, uint64(chunk)*0x9e3779b97f4a7c15)
}

// remoteMetadata is the small per-chunk record the redis backend stores
// next to the payload (length, shape, dtype, format as int32s).
func remoteMetadata(length int) []byte {
	b := make([]byte, 0, 28)
	for _, v := range []int32{int32(length), 2, 32, 256, 1024, 3, 1} {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	return b
}

func payload(chunk, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(chunk*31 + i*7)
	}
	return b
}

// TestLMCacheRedisBackend replays the redis:// backend (redis-py):
// connection set-up, then per chunk SET <key>kv_bytes before SET
// <key>metadata; lookups EXISTS <key>metadata; a get reads metadata then
// kv_bytes, and deletes the metadata when the payload is gone.
func TestLMCacheRedisBackend(t *testing.T) {
	for _, auth := range []bool{false, true} {
		t.Run(fmt.Sprintf("auth=%v", auth), func(t *testing.T) {
			opt := Options{}
			if auth {
				opt.Password = "s3cret"
			}
			l := startListener(t, opt, nil)
			c := dialRaw(t, l.addr)
			expect := func(req []byte, want string) {
				t.Helper()
				if got := c.do(req); string(got) != want {
					t.Fatalf("%q: got %q, want %q", req[:min(len(req), 60)], got[:min(len(got), 60)], want[:min(len(want), 60)])
				}
			}
			// redis-py's on_connect: AUTH when a password is set, then
			// CLIENT SETINFO (its errors are ignored, but kvd answers OK).
			if auth {
				expect(encode("AUTH", "s3cret"), "+OK\r\n")
			}
			expect(encode("CLIENT", "SETINFO", "LIB-NAME", "redis-py"), "+OK\r\n")
			expect(encode("CLIENT", "SETINFO", "LIB-VER", "5.2.1"), "+OK\r\n")
			lmcacheRedisSequence(t, c)
		})
	}
}

// lmcacheRedisSequence is the redis:// backend's data path on a connected
// c: SET kv_bytes then metadata per chunk, EXISTS until the first miss,
// GET metadata then kv_bytes, and the cleanup of a chunk whose payload
// is gone.
func lmcacheRedisSequence(t *testing.T, c *rconn) {
	t.Helper()
	expect := func(req []byte, want string) {
		t.Helper()
		if got := c.do(req); string(got) != want {
			t.Fatalf("%q: got %q, want %q", req[:min(len(req), 60)], got[:min(len(got), 60)], want[:min(len(want), 60)])
		}
	}
	const chunks, size = 8, 300 << 10
	for i := range chunks {
		k := lmcacheKey(0, i)
		expect(encode("SET", k+"kv_bytes", string(payload(i, size))), "+OK\r\n")
		expect(encode("SET", k+"metadata", string(remoteMetadata(size))), "+OK\r\n")
	}
	// batched_async_contains: EXISTS per key until the first miss.
	for i := range chunks {
		expect(encode("EXISTS", lmcacheKey(0, i)+"metadata"), ":1\r\n")
	}
	expect(encode("EXISTS", lmcacheKey(0, chunks)+"metadata"), ":0\r\n")
	for i := range chunks {
		k := lmcacheKey(0, i)
		expect(encode("GET", k+"metadata"), string(appendBulk(nil, remoteMetadata(size))))
		expect(encode("GET", k+"kv_bytes"), string(appendBulk(nil, payload(i, size))))
	}
	// A missing chunk: GET metadata answers nil and the get stops.
	expect(encode("GET", lmcacheKey(0, chunks)+"metadata"), "$-1\r\n")
	// Payload evicted but metadata left: GET kv_bytes is nil, then DEL metadata.
	k := lmcacheKey(0, 3)
	expect(encode("DEL", k+"kv_bytes"), ":1\r\n")
	expect(encode("GET", k+"metadata"), string(appendBulk(nil, remoteMetadata(size))))
	expect(encode("GET", k+"kv_bytes"), "$-1\r\n")
	expect(encode("DEL", k+"metadata"), ":1\r\n")
	expect(encode("EXISTS", k+"metadata"), ":0\r\n")
}

// respWorker is one worker connection of LMCache's native RESP backend:
// it sends each command as one writev of prebuilt parts and reads exactly
// the reply bytes it expects ("+OK\r\n", ":0\r\n"/":1\r\n", or
// "$<chunk_size>\r\n" + payload + "\r\n" / "$-1\r\n").
type respWorker struct {
	c     io.ReadWriter
	chunk int
}

func (w *respWorker) readExactly(n int) ([]byte, error) {
	b := make([]byte, n)
	_, err := io.ReadFull(w.c, b)
	return b, err
}

func (w *respWorker) set(key string, buf []byte) error {
	var req bytes.Buffer
	req.WriteString("*3\r\n$3\r\nSET\r\n")
	req.Write(appendBulkString(nil, key))
	req.WriteString("$" + strconv.Itoa(w.chunk) + "\r\n")
	req.Write(buf)
	req.WriteString("\r\n")
	if _, err := w.c.Write(req.Bytes()); err != nil {
		return err
	}
	got, err := w.readExactly(5)
	if err != nil || string(got) != "+OK\r\n" {
		return fmt.Errorf("SET: response was not OK: %q %v", got, err)
	}
	return nil
}

func (w *respWorker) intReply(cmd, key string) (bool, error) {
	if _, err := w.c.Write(encode(cmd, key)); err != nil {
		return false, err
	}
	got, err := w.readExactly(4)
	switch {
	case err != nil:
		return false, err
	case string(got) == ":1\r\n":
		return true, nil
	case string(got) == ":0\r\n":
		return false, nil
	}
	return false, fmt.Errorf("%s: invalid response %q", cmd, got)
}

// get returns nil, nil for a miss.
func (w *respWorker) get(key string) ([]byte, error) {
	if _, err := w.c.Write(encode("GET", key)); err != nil {
		return nil, err
	}
	var hdr []byte
	for {
		b, err := w.readExactly(1)
		if err != nil {
			return nil, err
		}
		hdr = append(hdr, b[0])
		if b[0] == '\n' {
			break
		}
	}
	if string(hdr) == "$-1\r\n" {
		return nil, nil
	}
	if string(hdr) != "$"+strconv.Itoa(w.chunk)+"\r\n" {
		return nil, fmt.Errorf("GET: size header mismatch %q", hdr)
	}
	v, err := w.readExactly(w.chunk + 2)
	if err != nil || !bytes.HasSuffix(v, []byte("\r\n")) {
		return nil, fmt.Errorf("GET: trailer mismatch %v", err)
	}
	return v[:w.chunk], nil
}

// TestLMCacheRESPBackend replays the resp:// backend: several worker
// connections (AUTH user password first), each storing and reading
// fixed-size chunks concurrently.
func TestLMCacheRESPBackend(t *testing.T) {
	const workers, perWorker, chunk = 4, 12, 512 << 10
	// Slots sized for the fixed chunk, as an operator sets --arena-slot-bytes.
	l := startListener(t, Options{User: "lmcache", Password: "pw"}, func(o *kvd.StoreOptions) { o.SlotBytes = chunk + 64 })
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for wi := range workers {
		c := dialRaw(t, l.addr)
		w := &respWorker{c: c.c, chunk: chunk}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				if _, err := c.c.Write([]byte("*3\r\n$4\r\nAUTH\r\n$7\r\nlmcache\r\n$2\r\npw\r\n")); err != nil {
					return err
				}
				if got, err := w.readExactly(5); err != nil || string(got) != "+OK\r\n" {
					return fmt.Errorf("AUTH: %q %v", got, err)
				}
				for i := range perWorker {
					k := lmcacheKey(wi, i)
					if ok, err := w.intReply("EXISTS", k); err != nil || ok {
						return fmt.Errorf("EXISTS before set: %v %v", ok, err)
					}
					if err := w.set(k, payload(wi*100+i, chunk)); err != nil {
						return err
					}
				}
				for i := range perWorker {
					k := lmcacheKey(wi, i)
					if ok, err := w.intReply("EXISTS", k); err != nil || !ok {
						return fmt.Errorf("EXISTS after set: %v %v", ok, err)
					}
					v, err := w.get(k)
					if err != nil {
						return err
					}
					if !bytes.Equal(v, payload(wi*100+i, chunk)) {
						return fmt.Errorf("chunk %d/%d: wrong bytes", wi, i)
					}
				}
				if v, err := w.get(lmcacheKey(wi, perWorker)); err != nil || v != nil {
					return fmt.Errorf("GET of a missing chunk: %d bytes, %v", len(v), err)
				}
				if ok, err := w.intReply("DEL", lmcacheKey(wi, 0)); err != nil || !ok {
					return fmt.Errorf("DEL: %v %v", ok, err)
				}
				if ok, err := w.intReply("DEL", lmcacheKey(wi, 0)); err != nil || ok {
					return fmt.Errorf("second DEL: %v %v", ok, err)
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}
