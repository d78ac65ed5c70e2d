package dispatcher

import "flag"

// RegisterFlags adds the dispatcher's own flags; shared ones (--workers,
// --snapshot-wait, --events-qps...) live in pkg/cli.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.RunRelay, "run-schedule-relay", true, "relay fired schedules (retries, resyncs) into MC_WORK from this replica")
	fs.BoolVar(&c.RunDLQ, "run-dead-letter", true, "move poison messages to MC_DLQ from this replica")
}
