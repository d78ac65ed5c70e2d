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
	// NKey is the user's public nkey (U...), when the hook's owner made the
	// seed and keeps it. Empty: `metabus credentials ensure --hook-user
	// <name>` makes the seed (Secret HookSecret(Name)) and puts the public
	// key in UsersSecret, which nats-server reads as $HOOK_<NAME>_NKEY.
	NKey string `json:"nkey,omitempty"`
	// Subjects are what it may subscribe to; empty means
	// HookSubjectRoot+Name+".>". Each must be under that.
	Subjects []string `json:"subjects,omitempty"`
}

// HookSecret names the Secret a hook user's seed is kept in, for the hook's
// pods (key SeedKey). metabus never reads it.
func HookSecret(name string) string { return natsx.CredentialsSecretPrefix + "hook-" + name }

// HookUserID is the credentials user of hook user name, as Ensure and
// EnsureTLS take it: its seed Secret SeedSecret(HookUserID(name)) is
// HookSecret(name), its public key is UsersSecret's
// UserKey(HookUserID(name)) (HOOK_<NAME>_NKEY), its TLS certificate
// ClientTLSSecret(HookUserID(name)).
func HookUserID(name string) string { return "hook-" + name }

// HookUserIDs checks hook user names (DNS labels, each once) and returns
// their credentials users, in order.
func HookUserIDs(names []string) ([]string, error) {
	seen := map[string]bool{}
	ids := make([]string, 0, len(names))
	for _, n := range names {
		if err := checkHookName(n, seen); err != nil {
			return nil, err
		}
		ids = append(ids, HookUserID(n))
	}
	return ids, nil
}

// checkHookName checks one hook user name, and that it is not in seen,
// then adds it.
func checkHookName(name string, seen map[string]bool) error {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("hook user name %q: %s", name, strings.Join(errs, "; "))
	}
	if seen[name] {
		return fmt.Errorf("hook user %s is listed twice", name)
	}
	seen[name] = true
	return nil
}

// nkeyRef is what the configuration names as the user's nkey: the public
// key given, or the variable holding the one ensure generated.
func (u HookUser) nkeyRef() (string, error) {
	if u.NKey == "" {
		return "$" + UserKey(HookUserID(u.Name)), nil
	}
	if !nkeys.IsValidPublicUserKey(u.NKey) {
		return "", fmt.Errorf("hook user %s: nkey %q is not a public user nkey (U...)", u.Name, u.NKey)
	}
	return u.NKey, nil
}

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
		if err := checkHookName(u.Name, seen); err != nil {
			return "", err
		}
		nkey, err := u.nkeyRef()
		if err != nil {
			return "", err
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
		fmt.Fprintf(&b, "    {\n      nkey: %s\n      permissions: {\n", nkey)
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

// The files of a hook users kustomize component (HookUsersComponent).
const (
	ComponentKustomization = "kustomization.yaml"
	ComponentConf          = "nats-server.conf"
)

// HookUsersComponent renders a kustomize component that adds hook users to
// an install made from deploy/ (or an overlay of it): conf (the install's
// nats-server.conf) with the users inserted, merged into the nats-config
// ConfigMap, and, for each user without nkey, `--hook-user=<name>` on the
// credentials init container of the NATS pods and its seed and
// certificate Secrets in the credentials Role, so that ensure makes them
// as Helm's nats.hookUsers does. It returns the component's files by name.
func HookUsersComponent(conf string, users []HookUser) (map[string][]byte, error) {
	withUsers, err := InsertHookUsers(conf, users)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(users))
	var initArgs, roleNames strings.Builder
	for i, u := range users {
		names[i] = u.Name
		if u.NKey != "" {
			continue
		}
		fmt.Fprintf(&initArgs, "    - op: add\n      path: /spec/template/spec/initContainers/0/args/-\n      value: --hook-user=%s\n", u.Name)
		fmt.Fprintf(&roleNames, "    - op: add\n      path: /rules/1/resourceNames/-\n      value: %s\n", HookSecret(u.Name))
		fmt.Fprintf(&roleNames, "    - op: add\n      path: /rules/2/resourceNames/-\n      value: %s\n", ClientTLSSecret(HookUserID(u.Name)))
	}
	var k strings.Builder
	fmt.Fprintf(&k, "# Hook users %s, made by `metabus credentials hook-users`\n", strings.Join(names, ", "))
	k.WriteString("# (docs/hooks-nats.md): run it again to change them rather than editing.\n")
	k.WriteString("apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\n")
	k.WriteString("configMapGenerator:\n- name: nats-config\n  behavior: merge\n  files:\n  - " + ComponentConf + "\n")
	if initArgs.Len() > 0 {
		k.WriteString("patches:\n- target:\n    kind: StatefulSet\n    name: nats\n  patch: |-\n")
		k.WriteString(strings.TrimSuffix(initArgs.String(), "\n") + "\n")
		k.WriteString("- target:\n    kind: Role\n    name: metabus-credentials\n  patch: |-\n")
		k.WriteString(strings.TrimSuffix(roleNames.String(), "\n") + "\n")
	}
	return map[string][]byte{ComponentKustomization: []byte(k.String()), ComponentConf: []byte(withUsers)}, nil
}

// ParseHookUser reads a hook user as the command line gives it: NAME, or
// NAME:SUBJECT,SUBJECT... (its own subjects, each under hooks.NAME.).
func ParseHookUser(arg string) (HookUser, error) {
	name, subjects, hasSubjects := strings.Cut(arg, ":")
	u := HookUser{Name: name}
	if hasSubjects {
		u.Subjects = strings.Split(subjects, ",")
	}
	if _, err := u.subjects(); err != nil {
		return HookUser{}, err
	}
	return u, nil
}
