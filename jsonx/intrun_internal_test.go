package jsonx

import (
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"testing"
)

// intRunAlphabet is what a run's bytes are drawn from: digits and commas
// mostly, and each byte that ends or spoils a run.
const intRunAlphabet = "0123456789,,,,000.eE] -+x\"\x80\xb0\xb9\xff"

func checkIntRun(t *testing.T, b []byte) {
	t.Helper()
	j, ok := shortInteger(b, 0)
	if !ok {
		return
	}
	if got, want := intRun(b, j), intRunBytewise(b, j); got != want {
		t.Fatalf("intRun(%q, %d) = %d, want %d", b, j, got, want)
	}
}

// TestIntRunAgrees: the run read eight bytes at a time ends where it ends
// read one integer at a time, for random runs of every length to 40 over
// intRunAlphabet (and of digits and commas only), and for every word
// intRun8 accepts the bytes before its last comma are whole integers.
func TestIntRunAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 5))
	for _, alphabet := range []string{intRunAlphabet, "0123456789,", "01,", "0,,1"} {
		for n := 1; n <= 40; n++ {
			for range 3000 {
				b := make([]byte, n)
				b[0] = "123456789"[r.IntN(9)]
				for i := 1; i < n; i++ {
					b[i] = alphabet[r.IntN(len(alphabet))]
				}
				checkIntRun(t, b)
			}
		}
	}
	// Every byte, alone among digits and commas, is classed as itself and
	// so are the others (a byte from 0x80: those below it; a carry from it
	// may mark those above, after the fault it is).
	for v := range 256 {
		for k := range 8 {
			w := []byte("1,23,4,5")
			w[k] = byte(v)
			d, c, z := intClass8(binary.LittleEndian.Uint64(w))
			for i, got := range [3]uint64{d, c, z} {
				want := [3]bool{v >= '0' && v <= '9', v == ',', v == '0'}[i]
				for n := range 8 {
					if v >= 0x80 && n > k {
						break // a carry from it may mark bytes above: it is the fault before them
					}
					if (got>>(8*n+7)&1 == 1) != (n == k && want || n != k && [3]bool{w[n] >= '0' && w[n] <= '9', w[n] == ',', w[n] == '0'}[i]) {
						t.Fatalf("intClass8(%q): class %d of byte %d is %v", w, i, n, got>>(8*n+7)&1 == 1)
					}
				}
			}
		}
	}
	// Block ids as vLLM sends them, and token ids of up to six digits.
	for _, s := range []string{
		"0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24]",
		"151644,872,198,151645,9707,0,1,23,456,7890,12345]",
		"1,2,3,4,5,6,7,8",
		"1,2,3,4,5,6,7,",
		"1,2,3,4,5,6,7,0",
		"1,2,3,4,5,0,1,2]",
		"1,2,3,4,5,6,01]",
		"1,2,3,4,5,6,7.5]",
		"1,2,3,4,5,6,7e5]",
		"1,2,,3,4,5,6,7]",
		"1,12345678,1]",
		"1,1234567,1]",
	} {
		checkIntRun(t, []byte(s))
	}
}

// FuzzIntRun holds intRun to intRunBytewise on any bytes.
func FuzzIntRun(f *testing.F) {
	f.Add([]byte("0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]"))
	f.Add([]byte("1,2,3,4,5,6,01,2]"))
	f.Add([]byte("1,2,3,4,5,6,7.5,1]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkIntRun(t, b)
		for i := range b {
			if b[i] == ',' {
				if got, want := intRun(b, i), intRunBytewise(b, i); got != want {
					t.Fatalf("intRun(%q, %d) = %d, want %d", b, i, got, want)
				}
			}
		}
	})
}

// BenchmarkIntRun: a run of 200 block ids of one to five digits, read by
// intRun and by intRunBytewise (callgrind compares them: docs/performance.md,
// session 25).
func BenchmarkIntRun(b *testing.B) {
	for _, base := range []int{0, 100, 10000} {
		var run []byte
		for i := range 200 {
			run = strconv.AppendInt(append(run, ','), int64(base+i*7), 10)
		}
		run = append(run, ']')
		for name, f := range map[string]func([]byte, int) int{"blocks": intRun, "bytewise": intRunBytewise} {
			b.Run(strconv.Itoa(base)+"/"+name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if f(run, 0) != len(run)-1 {
						b.Fatal("short run")
					}
				}
			})
		}
	}
}
