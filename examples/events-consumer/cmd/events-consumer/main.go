// Command events-consumer prints the applied events metabus publishes
// (docs/events.md), connected as the read-only NATS user events.
//
//	events-consumer --nats-url tls://nats.metabus:4222 --nkey events.seed \
//	  --nats-ca ca.crt --nats-cert tls.crt --nats-key tls.key
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go"

	eventsconsumer "github.com/metabus/metabus/examples/events-consumer"
)

func main() {
	url := flag.String("nats-url", "nats://127.0.0.1:4222", "NATS server URL")
	seed := flag.String("nkey", "", "the events user's nkey seed file (Secret metabus-nats-events, key nkey.seed)")
	ca := flag.String("nats-ca", "", "CA bundle to verify the NATS server (TLS installs)")
	cert := flag.String("nats-cert", "", "the events user's client certificate (Secret metabus-nats-events-tls, tls.crt)")
	key := flag.String("nats-key", "", "its key (tls.key)")
	subject := flag.String("subject", "metabus.events.applied.>", "which events: metabus.events.<kind>.<controller>.<namespace>.<name>, wildcards allowed")
	flag.Parse()

	opts := []nats.Option{nats.Name("events-consumer"), nats.CustomInboxPrefix(eventsconsumer.InboxPrefix)}
	if *seed != "" {
		o, err := nats.NkeyOptionFromSeed(*seed)
		if err != nil {
			log.Fatalf("nkey: %v", err)
		}
		opts = append(opts, o)
	}
	if *ca != "" {
		opts = append(opts, nats.RootCAs(*ca))
	}
	if *cert != "" || *key != "" {
		opts = append(opts, nats.ClientCert(*cert, *key))
	}
	nc, err := nats.Connect(*url, opts...)
	if err != nil {
		log.Fatalf("connect: %v", err)
	}
	defer nc.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err = eventsconsumer.Receive(ctx, nc, *subject, func(e cloudevents.Event) {
		line, err := eventsconsumer.Describe(e)
		if err != nil {
			log.Print(err)
			return
		}
		fmt.Println(line)
	})
	if err != nil {
		log.Fatal(err)
	}
}
