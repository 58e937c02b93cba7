package idemhttp_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
)

// rawRequest writes req byte for byte to the server at addr and reads the
// answer, so that requests net/http's client refuses to send can be tried.
func rawRequest(t *testing.T, addr, req string) answer {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func rawPost(keyLines, body string) string {
	return fmt.Sprintf("POST /payments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		keyLines, len(body), body)
}

// TestBadInput sends each bad request of the issue and checks its
// documented answer, that nothing ran, and that the key is not held.
func TestBadInput(t *testing.T) {
	pay := &payments{}
	m := newMiddleware(t, dedup.NewMemoryStore(), idemhttp.WithMaxBodyBytes(1024))
	srv := serve(t, m.Wrap(pay))
	addr := srv.Listener.Addr().String()
	good := newKey()
	for _, tc := range []struct {
		name    string
		req     string
		status  int
		problem idemhttp.Problem // "" when net/http itself refuses the request
	}{
		{"missing key", rawPost("", order), 400, idemhttp.ProblemKeyMissing},
		{"10 KB key", rawPost(`Idempotency-Key: "`+strings.Repeat("k", 10<<10)+"\"\r\n", order), 400, idemhttp.ProblemKeyTooLong},
		{"256-byte key", rawPost(`Idempotency-Key: "`+strings.Repeat("0123456789abcdef", 16)+"x\"\r\n", order), 400, idemhttp.ProblemKeyTooLong},
		{"empty key", rawPost("Idempotency-Key: \"\"\r\n", order), 400, idemhttp.ProblemKeyMalformed},
		{"empty field", rawPost("Idempotency-Key:\r\n", order), 400, idemhttp.ProblemKeyMalformed},
		{"unquoted key with a space", rawPost("Idempotency-Key: "+good[:10]+" "+good[10:]+"\r\n", order), 400, idemhttp.ProblemKeyMalformed},
		{"unquoted key with parameters", rawPost("Idempotency-Key: "+good+";p=1\r\n", order), 400, idemhttp.ProblemKeyMalformed},
		{"tab in key", rawPost("Idempotency-Key: \""+good[:10]+"\t"+good[10:]+"\"\r\n", order), 400, idemhttp.ProblemKeyMalformed},
		{"non-ASCII key", rawPost("Idempotency-Key: \""+good+"é\"\r\n", order), 400, idemhttp.ProblemKeyMalformed},
		{"control character", rawPost("Idempotency-Key: \""+good+"\x01\"\r\n", order), 400, ""},
		{"two keys in one field", rawPost(`Idempotency-Key: "`+good+`", "`+newKey()+"\"\r\n", order), 400, idemhttp.ProblemKeyMalformed},
		{"two key fields", rawPost(`Idempotency-Key: "`+good+"\"\r\nIdempotency-Key: \""+good+"\"\r\n", order), 400, idemhttp.ProblemKeyMultiple},
		{"low-entropy key", rawPost("Idempotency-Key: \"aaaaaaaaaaaaaaaaaaaa\"\r\n", order), 400, idemhttp.ProblemKeyLowEntropy},
		{"counter key", rawPost("Idempotency-Key: \"order-1\"\r\n", order), 400, idemhttp.ProblemKeyLowEntropy},
		{"body over the limit", rawPost(`Idempotency-Key: "`+good+"\"\r\n", `{"amount":1,"pad":"`+strings.Repeat("x", 2000)+`"}`), 413, idemhttp.ProblemBodyTooLarge},
		{"invalid JSON", rawPost(`Idempotency-Key: "`+good+"\"\r\n", `{"amount": 42`), 400, idemhttp.ProblemInvalidJSON},
		{"trailing JSON", rawPost(`Idempotency-Key: "`+good+"\"\r\n", `{"amount": 42} {}`), 400, idemhttp.ProblemInvalidJSON},
		{"huge JSON number", rawPost(`Idempotency-Key: "`+good+"\"\r\n", `{"amount": 1e999999999}`), 400, idemhttp.ProblemInvalidJSON},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := rawRequest(t, addr, tc.req)
			if a.status != tc.status {
				t.Errorf("status %d %q, want %d", a.status, a.body, tc.status)
			}
			if tc.problem != "" && a.problemType() != problem(tc.problem) {
				t.Errorf("problem %q, want %q", a.problemType(), problem(tc.problem))
			}
		})
	}
	if n := pay.charges.Load(); n != 0 {
		t.Fatalf("%d charges after bad input", n)
	}
	// None of it held or stored the good key.
	if a := mustPost(t, srv.URL+"/payments", good, order); a.status != http.StatusCreated || a.replayed() {
		t.Errorf("good key after bad input: %d replayed=%v", a.status, a.replayed())
	}
}

// TestUnquotedKeyAccepted: a key sent without quotes, as clients written
// for other APIs send it, is the same key as its quoted form: the retry
// with quotes replays the first answer.
func TestUnquotedKeyAccepted(t *testing.T) {
	pay := &payments{}
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore()).Wrap(pay))
	addr := srv.Listener.Addr().String()
	key := newKey()
	first := rawRequest(t, addr, rawPost("Idempotency-Key: "+key+"\r\n", order))
	if first.status != http.StatusCreated {
		t.Fatalf("unquoted key: status %d %q", first.status, first.body)
	}
	again := rawRequest(t, addr, rawPost(`Idempotency-Key: "`+key+"\"\r\n", order))
	if again.status != http.StatusCreated || !again.replayed() || again.body != first.body {
		t.Fatalf("quoted retry: status %d, replayed %v, body %q; first body %q", again.status, again.replayed(), again.body, first.body)
	}
	if n := pay.charges.Load(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// TestParametersAccepted: an Item's parameters are parsed and ignored.
func TestParametersAccepted(t *testing.T) {
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore()).Wrap(&payments{}))
	key := newKey()
	for _, field := range []string{`"` + key + `";a=1;b="x";c=?0;d=tok/en;e=:aGk=:;f`, ` "` + key + `" `} {
		a := rawRequest(t, srv.Listener.Addr().String(), rawPost("Idempotency-Key: "+field+"\r\n", order))
		if a.status != http.StatusCreated {
			t.Errorf("field %q: %d %q", field, a.status, a.body)
		}
	}
	a := rawRequest(t, srv.Listener.Addr().String(), rawPost(`Idempotency-Key: "`+key+`";A=1`+"\r\n", order))
	if a.status != http.StatusBadRequest {
		t.Errorf("upper-case parameter: %d", a.status)
	}
}

// TestClientGoneMidBody: a client that sends half its body and hangs up
// runs nothing and holds nothing.
func TestClientGoneMidBody(t *testing.T) {
	pay := &payments{}
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore()).Wrap(pay))
	key := newKey()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /payments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: %q\r\nContent-Length: 1000\r\n\r\n{\"amount\":", key)
	time.Sleep(50 * time.Millisecond)
	conn.Close()
	time.Sleep(50 * time.Millisecond)
	if a := mustPost(t, srv.URL+"/payments", key, order); a.status != http.StatusCreated || a.replayed() {
		t.Errorf("retry after the hang-up: %d replayed=%v", a.status, a.replayed())
	}
	if n := pay.charges.Load(); n != 1 {
		t.Errorf("%d charges, want 1", n)
	}
}

// TestOptionalKey lets a keyless request through, unprotected.
func TestOptionalKey(t *testing.T) {
	pay := &payments{}
	srv := serve(t, newMiddleware(t, dedup.NewMemoryStore(), idemhttp.WithOptionalKey()).Wrap(pay))
	for range 2 {
		if a := mustPost(t, srv.URL, "", order); a.status != http.StatusCreated || a.replayed() {
			t.Errorf("keyless: %d", a.status)
		}
	}
	if n := pay.charges.Load(); n != 2 {
		t.Errorf("%d charges, want 2", n)
	}
}
