package ujson

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	sigsjson "sigs.k8s.io/json"
)

// decodeFast is Decode's own path: ok false where Decode hands the input
// to sigs.k8s.io/json.
func decodeFast(data []byte, preserveInts bool) (any, bool) {
	r := NewReader(data, preserveInts)
	v, ok := r.Value()
	return v, ok && r.End()
}

// checkDecode holds Decode and DecodeMap, and a Reader without
// PreserveInts, to the decoders they stand in for: the same value (types
// included: cmp tells an int64 from a float64) or an error where they
// fail.
func checkDecode(t *testing.T, in string) (fast bool) {
	t.Helper()
	var want any
	wantErr := sigsjson.UnmarshalCaseSensitivePreserveInts([]byte(in), &want)
	got, err := Decode([]byte(in))
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("Decode(%q) error = %v, sigs.k8s.io/json's = %v", in, err, wantErr)
	}
	// On an error sigs.k8s.io/json leaves a partial value; Decode none.
	if diff := diffTrees(want, got); wantErr == nil && diff != "" {
		t.Fatalf("Decode(%q) differs from sigs.k8s.io/json (-want +got):\n%s", in, diff)
	}
	_, fast = decodeFast([]byte(in), true)
	if fast && wantErr != nil {
		t.Fatalf("the fast path took %q, which sigs.k8s.io/json rejects: %v", in, wantErr)
	}

	var wantMap map[string]any
	wantErr = sigsjson.UnmarshalCaseSensitivePreserveInts([]byte(in), &wantMap)
	gotMap, err := DecodeMap([]byte(in))
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("DecodeMap(%q) error = %v, sigs.k8s.io/json's = %v", in, err, wantErr)
	}
	if diff := diffTrees(wantMap, gotMap); wantErr == nil && diff != "" {
		t.Fatalf("DecodeMap(%q) differs from sigs.k8s.io/json (-want +got):\n%s", in, diff)
	}

	var wantStd any
	stdErr := json.Unmarshal([]byte(in), &wantStd)
	if v, ok := decodeFast([]byte(in), false); ok {
		if stdErr != nil {
			t.Fatalf("a Reader without PreserveInts took %q, which encoding/json rejects: %v", in, stdErr)
		}
		if diff := diffTrees(wantStd, v); diff != "" {
			t.Fatalf("a Reader without PreserveInts differs from encoding/json on %q (-want +got):\n%s", in, diff)
		}
	}
	return fast
}

// diffTrees is cmp.Diff, after reflect.DeepEqual (which also tells an
// int64 from a float64) for speed: cmp takes minutes over 10,000 levels.
func diffTrees(want, got any) string {
	if reflect.DeepEqual(want, got) {
		return ""
	}
	return cmp.Diff(want, got)
}

func nested(open, close string, n int) string {
	return strings.Repeat(open, n) + strings.Repeat(close, n)
}

// TestDecodeMatchesSigsJSON pins the cases where the two could part: the
// number rules, strings, whitespace, nesting and errors. fast says whether
// Decode's own path takes the input (false: it is handed to
// sigs.k8s.io/json, which decides).
func TestDecodeMatchesSigsJSON(t *testing.T) {
	for _, c := range []struct {
		reason, in string
		fast       bool
	}{
		{"an object", `{"a":1,"b":[true,false,null],"c":{"d":"e"}}`, true},
		{"integers stay int64", `[0,-0,1,-1,9223372036854775807,-9223372036854775808,123456789012345678]`, true},
		{"a fraction makes a float even when whole", `[1.0,-0.0,0.5,1.5e3]`, true},
		{"an exponent without a '.' is a float (ParseInt refuses it)", `[1e3,1E3,1e+3,-2e-3,0e0]`, true},
		{"integers beyond int64 are floats", `[9223372036854775808,-9223372036854775809,123456789012345678901234567890]`, true},
		{"a float out of range is an error", `[1e400]`, false},
		{"a negative float out of range is an error", `{"a":-1e999}`, false},
		{"a tiny float is 0, not an error", `[1e-400]`, true},
		{"leading zeros are a syntax error", `[01]`, false},
		{"a bare '-' is a syntax error", `[-]`, false},
		{"a '.' needs digits", `[1.]`, false},
		{"an exponent needs digits", `[1e]`, false},
		{"'+' cannot start a number", `[+1]`, false},
		{"whitespace everywhere", " \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" :\n{ } }\n ", true},
		{"a form feed is not JSON whitespace", "\f{}", false},
		{"duplicate keys: the last wins", `{"a":1,"a":{"x":2},"b":3,"a":"last"}`, true},
		{"keys are case-sensitive", `{"a":1,"A":2}`, true},
		{"escapes", `["\"\\\/\b\f\n\r\t","\u0041\u00e9\u4e16\u0000"]`, true},
		{"a surrogate pair", `"\ud83d\ude80"`, true},
		{"a lone high surrogate is U+FFFD", `"a\ud83db"`, true},
		{"a lone low surrogate is U+FFFD", `"\ude80"`, true},
		{"a high surrogate before a non-surrogate escape: U+FFFD, then the escape", `"\ud83d\u0041"`, true},
		{"two high surrogates", `"\ud83d\ud83d\ude80"`, true},
		{"upper-case hex", `"\u00E9\uD83D\uDE80"`, true},
		{"invalid UTF-8 becomes U+FFFD per byte", "[\"a\xffb\xc3(\xed\xa0\x80\"]", true},
		{"invalid UTF-8 with escapes", "\"\xff\\n\xfe\"", true},
		{"invalid UTF-8 in a key", "{\"\xff\":1}", true},
		{"an escaped key", `{"\u006bind":"X","k\"":1}`, true},
		{"a control character in a string is an error", "[\"a\nb\"]", false},
		{"an unknown escape is an error", `["\x"]`, false},
		{"a single quote escape is an error", `["\'"]`, false},
		{"a short \\u escape is an error", `["\u12"]`, false},
		{"a bad hex digit is an error", `["\u12g4"]`, false},
		{"an unterminated string", `["abc`, false},
		{"a trailing comma in an object", `{"a":1,}`, false},
		{"a trailing comma in an array", `[1,]`, false},
		{"a missing colon", `{"a" 1}`, false},
		{"a key that is not a string", `{1:2}`, false},
		{"trailing garbage", `{} x`, false},
		{"two values", `{}{}`, false},
		{"empty input", ``, false},
		{"only whitespace", "  \n", false},
		{"a misspelt literal", `[nul]`, false},
		{"a literal run on", `[truex]`, false},
		{"a top-level string (DecodeMap rejects it)", `"s"`, true},
		{"top-level null (DecodeMap gives nil)", `null`, true},
		{"a top-level number", ` -12.5e1 `, true},
		{"an empty object and array", `{"a":{},"b":[]}`, true},
		{"nesting at the decoders' limit", nested("[", "]", maxNesting), true},
		{"nesting past the limit", nested("[", "]", maxNesting+1), false},
		{"objects nested at the limit", strings.Repeat(`{"a":`, maxNesting) + "1" + strings.Repeat("}", maxNesting), true},
		{"objects nested past the limit", strings.Repeat(`{"a":`, maxNesting+1) + "1" + strings.Repeat("}", maxNesting+1), false},
		{"a Pod", podJSON, true},
	} {
		t.Run(c.reason, func(t *testing.T) {
			if fast := checkDecode(t, c.in); fast != c.fast {
				t.Errorf("fast path took it: %v, want %v", fast, c.fast)
			}
		})
	}
}

// TestDecodeErrorsAreWrapped: the error names what failed and keeps the
// decoder's own error (a *json.SyntaxError of sigs.k8s.io/json here).
func TestDecodeErrorsAreWrapped(t *testing.T) {
	_, err := Decode([]byte(`{"a":}`))
	if err == nil || !strings.HasPrefix(err.Error(), "decode JSON: ") {
		t.Fatalf("error %v, want one that says it is decoding JSON", err)
	}
	if ok, _ := sigsjson.SyntaxErrorOffset(unwrapAll(err)); !ok {
		t.Errorf("error %v does not wrap the decoder's syntax error", err)
	}
	if _, err := DecodeMap([]byte(`[1]`)); err == nil || !strings.Contains(err.Error(), "decode JSON object: ") {
		t.Errorf("DecodeMap of an array: error %v", err)
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

// TestDecodeRandomDocuments compares generated documents: valid ones with
// every number form, escape and whitespace, and the same corrupted (a byte
// changed, dropped or the document cut).
func TestDecodeRandomDocuments(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	n := 5000
	if testing.Short() {
		n = 2000
	}
	fast := 0
	for range n {
		doc := randomDocument(r, 0)
		if r.IntN(4) == 0 {
			doc = corrupt(r, doc)
		}
		if checkDecode(t, doc) {
			fast++
		}
	}
	// Most documents are valid: the fast path must take them, or the
	// comparison above holds little.
	if fast < n/2 {
		t.Errorf("the fast path took %d of %d documents", fast, n)
	}
}

var numberForms = []string{"0", "-0", "7", "-42", "1.0", "0.5", "-3.25", "1e3", "1E+2", "2e-3", "-1.5e10",
	"9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
	"12345678901234567890123", "1e400", "-1e400", "1e-400", "123456789012345678"}

var stringForms = []string{"", "a", "metadata", "<&>", `\"`, `\\`, `\/`, `\b\f\n\r\t`, `\u0041`, `\u00e9`, `\ud83d\ude80`,
	`\ud83d`, `\ude80x`, `\ud83d\u0041`, "\xff", "é世🚀", "\u2028", `\u0000`, "a b"}

func randomSpace(r *rand.Rand) string {
	if r.IntN(3) > 0 {
		return ""
	}
	return []string{" ", "\n", "\t", "\r\n  ", "  "}[r.IntN(5)]
}

func randomJSONString(r *rand.Rand) string {
	var b strings.Builder
	b.WriteByte('"')
	for range r.IntN(4) {
		b.WriteString(stringForms[r.IntN(len(stringForms))])
	}
	b.WriteByte('"')
	return b.String()
}

func randomDocument(r *rand.Rand, depth int) string {
	n := r.IntN(8)
	if depth > 4 {
		n = r.IntN(4)
	}
	s := randomSpace(r)
	switch n {
	case 0:
		return s + []string{"null", "true", "false"}[r.IntN(3)] + randomSpace(r)
	case 1:
		return s + numberForms[r.IntN(len(numberForms))] + randomSpace(r)
	case 2, 3:
		return s + randomJSONString(r) + randomSpace(r)
	case 4, 5:
		var parts []string
		for range r.IntN(5) {
			key := randomJSONString(r)
			if r.IntN(3) == 0 {
				key = `"k` + strconv.Itoa(r.IntN(3)) + `"` // duplicates
			}
			parts = append(parts, randomSpace(r)+key+randomSpace(r)+":"+randomDocument(r, depth+1))
		}
		return s + "{" + strings.Join(parts, ",") + randomSpace(r) + "}" + randomSpace(r)
	default:
		var parts []string
		for range r.IntN(5) {
			parts = append(parts, randomDocument(r, depth+1))
		}
		return s + "[" + strings.Join(parts, ",") + randomSpace(r) + "]" + randomSpace(r)
	}
}

func corrupt(r *rand.Rand, doc string) string {
	if doc == "" {
		return "x"
	}
	i := r.IntN(len(doc))
	switch r.IntN(3) {
	case 0:
		const junk = "{}[]\",:\\ \x01ae-.0"
		return doc[:i] + string(junk[r.IntN(len(junk))]) + doc[i+1:]
	case 1:
		return doc[:i] + doc[i+1:]
	default:
		return doc[:i]
	}
}

// FuzzDecodeUnstructured compares Decode with sigs.k8s.io/json on any
// input (make test runs it for FUZZTIME).
func FuzzDecodeUnstructured(f *testing.F) {
	for _, s := range []string{`{"a":[1,1.0,1e3,"\ud83d\ude80",null,true]}`, `"\ud83d\u0041"`, "[\"\xff\"]", `{"a":1,"a":2}`, `[9223372036854775808]`, `1e400`, podJSON} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkDecode(t, s)
	})
}

// podJSON is a Pod as the API server sends it.
const podJSON = `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-7d4b9c8f6-x2k9p","generateName":"web-7d4b9c8f6-","namespace":"default","uid":"5c3b6f0e-8a9d-4e2f-b1c7-3d5e6f7a8b9c","resourceVersion":"123456","creationTimestamp":"2026-11-29T02:00:00Z","labels":{"app":"web","pod-template-hash":"7d4b9c8f6"},"annotations":{"kubectl.kubernetes.io/restartedAt":"2026-11-28T10:00:00Z"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-7d4b9c8f6","uid":"8a9d4e2f-b1c7-3d5e-6f7a-8b9c5c3b6f0e","controller":true,"blockOwnerDeletion":true}],"managedFields":[{"manager":"kube-controller-manager","operation":"Update","apiVersion":"v1","time":"2026-11-29T02:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"8a9d4e2f-b1c7-3d5e-6f7a-8b9c5c3b6f0e\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{".":{},"f:image":{},"f:name":{},"f:ports":{}}}}}}]},"spec":{"volumes":[{"name":"kube-api-access-abcde","projected":{"sources":[{"serviceAccountToken":{"expirationSeconds":3607,"path":"token"}},{"configMap":{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}}],"defaultMode":420}}],"containers":[{"name":"web","image":"nginx:1.27","ports":[{"containerPort":80,"protocol":"TCP"}],"resources":{"limits":{"cpu":"500m","memory":"128Mi"},"requests":{"cpu":"250m","memory":"64Mi"}},"volumeMounts":[{"name":"kube-api-access-abcde","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}],"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent"}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","serviceAccount":"default","nodeName":"node-1","securityContext":{},"schedulerName":"default-scheduler","tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}],"priority":0,"enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-29T02:00:05Z"}],"hostIP":"10.0.0.5","podIP":"10.244.1.17","podIPs":[{"ip":"10.244.1.17"}],"startTime":"2026-11-29T02:00:00Z","containerStatuses":[{"name":"web","state":{"running":{"startedAt":"2026-11-29T02:00:04Z"}},"lastState":{},"ready":true,"restartCount":0,"image":"docker.io/library/nginx:1.27","imageID":"docker.io/library/nginx@sha256:0123456789abcdef","containerID":"containerd://abcdef0123456789","started":true}],"qosClass":"Burstable"}}`

func BenchmarkDecodePod(b *testing.B) {
	data := []byte(podJSON)
	b.Run("sigs.k8s.io/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var v map[string]any
			if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ujson.DecodeMap", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeMap(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
