package testkit

import (
	"sync"
	"testing"
)

func TestLogSinkConcurrent(t *testing.T) {
	var s LogSink
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				_, _ = s.Write([]byte(`{"message":"m"}` + "\n"))
			}
		}()
	}
	n := 0
	Eventually(t, "all writes", func() bool { n = s.Count("m"); return n == 200 })
	wg.Wait()
	if s.Count("other") != 0 {
		t.Fatal("counted a message never written")
	}
}

func TestLogSinkEntries(t *testing.T) {
	var s LogSink
	_, _ = s.Write([]byte(`{"message":"a","n":1}` + "\n" + `{"message":"b"}` + "\n"))
	if got := s.Find(t, "a"); len(got) != 1 || got[0]["n"] != 1.0 {
		t.Fatalf("Find(a) = %v", got)
	}
	if n := len(s.Entries(t)); n != 2 {
		t.Fatalf("%d entries, want 2", n)
	}
}
