package natscreds

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nkeys"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/metabus/metabus/pkg/natsx"
)

// HookSubjectRoot is where hook subjects live (the dispatcher's default
// --hook-subject-prefix): hook user <name> serves HookSubjectRoot+<name>+".>".
const HookSubjectRoot = "hooks."

// HookUsersMarker is the line of nats-server.conf, inside the users list,
// where hook users' entries are inserted (HookUsersConf).
const HookUsersMarker = "    # @hook-users"

// HookUser is the NATS user of one hook process (its replicas share it):
// it may subscribe to its own subjects only, in a queue group or not, and
// publish nothing but replies to the requests it received.
type HookUser struct {
	// Name is a DNS label; the user's seed lives in the Secret
	// HookSecret(Name), its subjects under HookSubjectRoot+Name+".".
	Name string `json:"name"`
	// NKey is the user's public nkey (U...). The seed stays with the hook.
	NKey string `json:"nkey"`
	// Subjects are what it may subscribe to; empty means
	// HookSubjectRoot+Name+".>". Each must be under that.
	Subjects []string `json:"subjects,omitempty"`
}

// HookSecret names the Secret a hook user's seed is kept in, for the hook's
// pods (key SeedKey). metabus never reads it.
func HookSecret(name string) string { return natsx.CredentialsSecretPrefix + "hook-" + name }

// subjects returns the user's subscribe subjects, defaulted and checked.
func (u HookUser) subjects() ([]string, error) {
	own := HookSubjectRoot + u.Name + "."
	if len(u.Subjects) == 0 {
		return []string{own + ">"}, nil
	}
	for _, s := range u.Subjects {
		if !strings.HasPrefix(s, own) || len(s) == len(own) {
			return nil, fmt.Errorf("hook user %s: subject %q is not under %s", u.Name, s, own)
		}
		if strings.ContainsAny(s, " \t\r\n\"") || strings.Contains(s, "..") || strings.HasSuffix(s, ".") {
			return nil, fmt.Errorf("hook user %s: subject %q is not a valid subject", u.Name, s)
		}
	}
	return u.Subjects, nil
}

// HookUsersConf renders the nats-server.conf users entries of hook users,
// to put in place of HookUsersMarker. Each may subscribe to its subjects,
// publishes nothing (deny >) but the replies allow_responses grants: one
// publish to the reply subject of each request it received.
func HookUsersConf(users []HookUser) (string, error) {
	var b strings.Builder
	seen := map[string]bool{}
	for _, u := range users {
		if errs := validation.IsDNS1123Label(u.Name); len(errs) > 0 {
			return "", fmt.Errorf("hook user name %q: %s", u.Name, strings.Join(errs, "; "))
		}
		if seen[u.Name] {
			return "", fmt.Errorf("hook user %s is listed twice", u.Name)
		}
		seen[u.Name] = true
		if !nkeys.IsValidPublicUserKey(u.NKey) {
			return "", fmt.Errorf("hook user %s: nkey %q is not a public user nkey (U...)", u.Name, u.NKey)
		}
		subjects, err := u.subjects()
		if err != nil {
			return "", err
		}
		quoted := make([]string, len(subjects))
		for i, s := range subjects {
			quoted[i] = strconv.Quote(s)
		}
		fmt.Fprintf(&b, "    # hook %s: its own subjects, and replies to the requests it received.\n", u.Name)
		fmt.Fprintf(&b, "    {\n      nkey: %s\n      permissions: {\n", u.NKey)
		b.WriteString("        publish: { deny: [\">\"] }\n")
		fmt.Fprintf(&b, "        subscribe: { allow: [%s] }\n", strings.Join(quoted, ", "))
		b.WriteString("        allow_responses: true\n      }\n    }\n")
	}
	return b.String(), nil
}

// InsertHookUsers returns conf (nats-server.conf) with the hook users'
// entries in place of its HookUsersMarker line.
func InsertHookUsers(conf string, users []HookUser) (string, error) {
	if strings.Count(conf, HookUsersMarker+"\n") != 1 {
		return "", errors.New("nats-server.conf has no (or more than one) " + strings.TrimSpace(HookUsersMarker) + " line")
	}
	entries, err := HookUsersConf(users)
	if err != nil {
		return "", err
	}
	return strings.Replace(conf, HookUsersMarker+"\n", entries, 1), nil
}
