package identity

import (
	"flag"
	"fmt"
)

// DefaultFlag is the operator's default identity flag: the account a
// controller without ServiceAccountAnnotation acts as.
const DefaultFlag = "default-service-account"

// RegisterDefaultFlag adds --default-service-account to fs, setting into.
// The applier (whose writes impersonate the identity) and the watcher
// (which sends a controller's hooks only what the identity may read) both
// take it, and must resolve a controller's identity the same way: where
// both register into one flag set (the all-in-one process), the second
// registration adds its target to the first's flag, so one value sets
// both.
func RegisterDefaultFlag(fs *flag.FlagSet, into *Identity) {
	if f := fs.Lookup(DefaultFlag); f != nil {
		if v, ok := f.Value.(*defaultFlag); ok {
			v.into = append(v.into, into)
			return
		}
	}
	fs.Var(&defaultFlag{into: []*Identity{into}}, DefaultFlag, "the ServiceAccount (<namespace>/<name>) a controller without the "+
		ServiceAccountAnnotation+" annotation acts as: its writes impersonate it and its hooks are sent only what it may list and watch. "+
		"Empty (the default): such a controller writes and reads with the services' own authority, as upstream")
}

// defaultFlag is --default-service-account's value, set into every
// registered target.
type defaultFlag struct{ into []*Identity }

func (f *defaultFlag) String() string {
	if f == nil || len(f.into) == 0 {
		return ""
	}
	return f.into[0].String()
}

func (f *defaultFlag) Set(v string) error {
	id, err := Parse(v)
	if err != nil {
		return fmt.Errorf("--%s: %w", DefaultFlag, err)
	}
	for _, p := range f.into {
		*p = id
	}
	return nil
}
