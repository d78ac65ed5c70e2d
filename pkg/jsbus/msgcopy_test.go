package jsbus

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// copyStream makes stream T (subjects t.>) and a durable consumer of
// subject t.<name>, and publishes m there.
func copyStream(t *testing.T, js jetstream.JetStream, name string, m *nats.Msg) jetstream.Consumer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "T", jetstream.ConsumerConfig{Durable: name, FilterSubject: "t." + name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	m.Subject = "t." + name
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	return c
}

// fetchOne is the consumer's next delivery, or nil if none comes within
// wait.
func fetchOne(t *testing.T, c jetstream.Consumer, wait time.Duration) jetstream.Msg {
	t.Helper()
	b, err := c.Fetch(1, jetstream.FetchMaxWait(wait))
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		return m
	}
	return nil
}

// TestMsgCopyReadsAsTheMessage: a copy answers every read as the client's
// message does.
func TestMsgCopyReadsAsTheMessage(t *testing.T) {
	nc, js := startNATS(t)
	for _, tc := range []struct {
		reason string
		name   string
		msg    *nats.Msg
	}{
		{reason: "CloudEvents headers and a body", name: "ce", msg: &nats.Msg{
			Header: nats.Header{"ce-specversion": {"1.0"}, "ce-type": {"sync.requested"}, "ce-weight": {"3"}, "ce-subject": {"/apis/x/v1/namespaces/a/things/b"}},
			Data:   []byte(`{"parent":{"name":"b"}}`),
		}},
		{reason: "a key with several values keeps them in order", name: "multi", msg: &nats.Msg{
			Header: nats.Header{"x-many": {"one", "two", "three"}, "x-empty": {""}},
			Data:   []byte("body"),
		}},
		{reason: "no headers at all", name: "bare", msg: &nats.Msg{Data: []byte("body")}},
		{reason: "no body", name: "empty", msg: &nats.Msg{Header: nats.Header{"k": {"v"}}}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			c := copyStream(t, js, tc.name, tc.msg)
			orig := fetchOne(t, c, 5*time.Second)
			if orig == nil {
				t.Fatal("nothing delivered")
			}
			cp := copyMsg(nc, orig)
			if _, ok := cp.(*msgCopy); !ok {
				t.Fatalf("copyMsg returned %T, want *msgCopy", cp)
			}
			if diff := cmp.Diff(orig.Subject(), cp.Subject()); diff != "" {
				t.Errorf("Subject (-client +copy):\n%s", diff)
			}
			if diff := cmp.Diff(orig.Reply(), cp.Reply()); diff != "" {
				t.Errorf("Reply (-client +copy):\n%s", diff)
			}
			if string(orig.Data()) != string(cp.Data()) {
				t.Errorf("Data: client %q, copy %q", orig.Data(), cp.Data())
			}
			if diff := cmp.Diff(orig.Headers(), cp.Headers()); diff != "" {
				t.Errorf("Headers (-client +copy):\n%s", diff)
			}
			for k, vs := range orig.Headers() {
				if got := headerValue(cp, k); got != vs[0] {
					t.Errorf("headerValue(%q) = %q, want %q", k, got, vs[0])
				}
			}
			if got := headerValue(cp, "absent"); got != "" {
				t.Errorf("headerValue(absent) = %q, want \"\"", got)
			}
			want, _ := orig.Metadata()
			got, err := cp.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Metadata (-client +copy):\n%s", diff)
			}
			// The copy owns its body: the client's buffer is not shared.
			if len(cp.Data()) > 0 && &cp.Data()[0] == &orig.Data()[0] {
				t.Error("the copy's body is the client's buffer")
			}
		})
	}
}

// TestMsgCopySettles: each settlement of a copy reaches the server as the
// client's would, and a copy is settled at most once.
func TestMsgCopySettles(t *testing.T) {
	nc, js := startNATS(t)
	ctx := context.Background()
	for _, tc := range []struct {
		reason string
		name   string
		settle func(m jetstream.Msg) error
		// redelivered: the message comes back within a second.
		redelivered bool
		// termReason: the reason in the server's termination advisory.
		termReason string
	}{
		{reason: "Ack settles", name: "ack", settle: func(m jetstream.Msg) error { return m.Ack() }},
		{reason: "DoubleAck settles once the server confirms", name: "double", settle: func(m jetstream.Msg) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return m.DoubleAck(ctx)
		}},
		{reason: "DoubleAck without a deadline has the client's default", name: "doublenodeadline", settle: func(m jetstream.Msg) error {
			return m.DoubleAck(context.Background())
		}},
		{reason: "Nak redelivers at once", name: "nak", settle: func(m jetstream.Msg) error { return m.Nak() }, redelivered: true},
		{reason: "NakWithDelay 0 is a Nak", name: "nakzero", settle: func(m jetstream.Msg) error { return m.NakWithDelay(0) }, redelivered: true},
		{reason: "NakWithDelay redelivers only after the delay", name: "nakdelay", settle: func(m jetstream.Msg) error { return m.NakWithDelay(time.Hour) }},
		{reason: "Term ends it", name: "term", settle: func(m jetstream.Msg) error { return m.Term() }},
		{reason: "TermWithReason ends it and names the reason", name: "termreason", settle: func(m jetstream.Msg) error { return m.TermWithReason("poison pill") }, termReason: "poison pill"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			c := copyStream(t, js, tc.name, &nats.Msg{Header: nats.Header{"k": {"v"}}, Data: []byte("x")})
			var adv chan *nats.Msg
			if tc.termReason != "" {
				adv = make(chan *nats.Msg, 1)
				sub, err := nc.ChanSubscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.T."+tc.name, adv)
				if err != nil {
					t.Fatal(err)
				}
				defer sub.Unsubscribe()
			}
			orig := fetchOne(t, c, 5*time.Second)
			if orig == nil {
				t.Fatal("nothing delivered")
			}
			m := copyMsg(nc, orig)
			if err := m.InProgress(); err != nil {
				t.Fatalf("InProgress before settling: %v", err)
			}
			if err := tc.settle(m); err != nil {
				t.Fatalf("settle: %v", err)
			}
			if err := m.Ack(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				t.Errorf("Ack after settling: %v, want ErrMsgAlreadyAckd", err)
			}
			if err := m.InProgress(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				t.Errorf("InProgress after settling: %v, want ErrMsgAlreadyAckd", err)
			}
			again := fetchOne(t, c, time.Second)
			if (again != nil) != tc.redelivered {
				t.Fatalf("redelivered: %v, want %v", again != nil, tc.redelivered)
			}
			if again != nil {
				md, _ := copyMsg(nc, again).Metadata()
				if md.NumDelivered != 2 {
					t.Errorf("redelivery's NumDelivered = %d, want 2", md.NumDelivered)
				}
				_ = again.Ack()
			}
			if adv != nil {
				select {
				case a := <-adv:
					var body struct {
						Reason string `json:"reason"`
					}
					if err := json.Unmarshal(a.Data, &body); err != nil {
						t.Fatal(err)
					}
					if body.Reason != tc.termReason {
						t.Errorf("advisory reason %q, want %q", body.Reason, tc.termReason)
					}
				case <-time.After(5 * time.Second):
					t.Error("no termination advisory")
				}
			}
			info, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.NumAckPending != 0 && !tc.redelivered && tc.name != "nakdelay" {
				t.Errorf("NumAckPending = %d after settling, want 0", info.NumAckPending)
			}
		})
	}
}

// TestMsgCopyNotJetStream: a message without JetStream metadata is
// passed on as it is, for the owner to report.
func TestMsgCopyNotJetStream(t *testing.T) {
	m := fakeMsg{}
	if got := copyMsg(nil, m); got != jetstream.Msg(m) {
		t.Errorf("copyMsg = %#v, want the message itself", got)
	}
}

// fakeMsg is a message whose reply subject holds no JetStream metadata.
type fakeMsg struct{ jetstream.Msg }

func (m fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return nil, jetstream.ErrNotJSMessage
}
