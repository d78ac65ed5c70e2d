package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natscreds"
)

// defaultNamespace is where the shipped manifests install metabus.
const defaultNamespace = "metabus"

// credentialsCommand is `metabus credentials`: it creates the per-service
// NATS credentials an install needs (ensure, run by an init container of
// every NATS pod) and replaces one service's on purpose (rotate).
func credentialsCommand() *cobra.Command {
	var (
		kubeconfig string
		namespace  string
		timeout    time.Duration
		tlsOpts    tlsFlags
		hookUsers  []string
	)
	store := func() (natscreds.Store, error) {
		cfg, err := (&cli.KubeFlags{Kubeconfig: kubeconfig, QPS: -1}).Config()
		if err != nil {
			return natscreds.Store{}, err
		}
		kube, err := kubeapi.NewForConfig(cfg)
		if err != nil {
			return natscreds.Store{}, err
		}
		return natscreds.Store{Kube: kube, Namespace: credentialsNamespace(namespace)}, nil
	}
	cmd := &cobra.Command{
		Use:   "credentials",
		Short: "Create or rotate the NATS credentials of metabus's services (Secrets metabus-nats-*)",
		Long: `Each service (watcher, dispatcher, applier, revisions) connects to NATS as
its own nkey user. Its seed is in the Secret metabus-nats-<service> (key
nkey.seed); nats-server reads the public keys from metabus-nats-users. The
two operator users (operator, operator-admin: the metabus and nats CLIs) and
the events user (read-only, for consumers of the bus's events) get their
seeds the same way; no pod mounts them.

The install runs "credentials ensure" in an init container of every NATS pod,
so nothing has to be created by hand.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fmt.Errorf("missing subcommand: want ensure or rotate\n\n%s", cmd.UsageString())
		},
		SilenceUsage: true,
	}
	cmd.PersistentFlags().StringVar(&kubeconfig, "kubeconfig", "", "path to a kubeconfig (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
	cmd.PersistentFlags().StringVarP(&namespace, "namespace", "n", "", "namespace of metabus (default: $POD_NAMESPACE, else "+defaultNamespace+")")
	cmd.PersistentFlags().DurationVar(&timeout, "timeout", 2*time.Minute, "give up after this long")

	ensure := &cobra.Command{
		Use:   "ensure",
		Short: "Create the credential Secrets that are missing; never replace an existing seed",
		Long: `Creates a seed Secret for each service that has none, and writes each seed's
public key into metabus-nats-users where it is missing or does not match.
Existing seeds are never replaced, so running it again changes nothing;
a run that stopped half way is completed by the next one.

With --tls (the default) it then does the same for NATS TLS: a CA
(metabus-nats-ca), the server's certificate (metabus-nats-server-tls, valid
for --tls-service and the pods of --tls-peers in the namespace, localhost and
127.0.0.1) and a client certificate per user (metabus-nats-<user>-tls),
signed by that CA. Existing ones are never replaced.

Each --hook-user NAME (a hook served over NATS, docs/hooks-nats.md) gets the
same: a seed in metabus-nats-hook-NAME for the hook's pods to mount, its
public key in metabus-nats-users as HOOK_NAME_NKEY (dashes as underscores,
upper case), which nats-server.conf's entry for that hook user names, and with
--tls a client certificate in metabus-nats-hook-NAME-tls.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hooks, err := natscreds.HookUserIDs(hookUsers)
			if err != nil {
				return fmt.Errorf("--hook-user: %w", err)
			}
			users := append(append([]string(nil), natscreds.Users...), hooks...)
			s, err := store()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			done, err := natscreds.Run(ctx, s, users, natscreds.GenerateSeed)
			report(cmd.OutOrStdout(), "NATS credentials", s.Namespace, done)
			if err != nil || !tlsOpts.enabled {
				return err
			}
			done, err = natscreds.RunTLS(ctx, s, tlsOpts.spec(users, s.Namespace, time.Now()))
			report(cmd.OutOrStdout(), "NATS TLS certificates", s.Namespace, done)
			return err
		},
	}
	ensure.Flags().BoolVar(&tlsOpts.enabled, "tls", true, "also create the NATS CA and the server's and every user's certificates that are missing (Secrets "+
		natscreds.CASecret+", "+natscreds.ServerTLSSecret+", metabus-nats-<user>-tls)")
	ensure.Flags().StringVar(&tlsOpts.service, "tls-service", "nats", "the NATS client Service the server certificate is for (<name>, <name>.<namespace>, .svc, .svc.cluster.local)")
	ensure.Flags().StringVar(&tlsOpts.peers, "tls-peers", "nats-headless", "the headless Service of the NATS pods, whose addresses the routes dial (*.<name>.<namespace>.svc); empty for none")
	ensure.Flags().DurationVar(&tlsOpts.validity, "tls-validity", natscreds.DefaultValidity, "validity of new certificates")
	ensure.Flags().StringArrayVar(&hookUsers, "hook-user", nil, "a hook user (a DNS label; repeatable) to make an nkey seed (Secret metabus-nats-hook-<name>), public key and certificate for")

	var service, hookUser string
	rotate := &cobra.Command{
		Use:   "rotate --service NAME | --hook-user NAME",
		Short: "Give one service or hook user a new nkey seed and nats-server its new public key",
		Long: `Replaces the seed in metabus-nats-<service> and the service's public key in
metabus-nats-users (with --hook-user, the hook user's seed in
metabus-nats-hook-<name> and its HOOK_<NAME>_NKEY; restart the hook's pods
instead of a service). nats-server reads the public keys when it starts, and the
service its seed when it connects, so restart both afterwards, NATS first
(the service is refused between the two restarts):

  kubectl -n metabus rollout restart statefulset -l app.kubernetes.io/component=nats
  kubectl -n metabus rollout status statefulset -l app.kubernetes.io/component=nats
  kubectl -n metabus rollout restart deployment -l app.kubernetes.io/component=<service>`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			users, who := natscreds.Users, service
			switch {
			case service != "" && hookUser != "":
				return errors.New("--service and --hook-user: give one")
			case hookUser != "":
				ids, err := natscreds.HookUserIDs([]string{hookUser})
				if err != nil {
					return fmt.Errorf("--hook-user: %w", err)
				}
				users, who = append(append([]string(nil), natscreds.Users...), ids[0]), ids[0]
			case service == "":
				return errors.New("--service is required: one of " + strings.Join(natscreds.Users, ", ") + " (or --hook-user NAME)")
			}
			s, err := store()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			done, err := natscreds.RunRotate(ctx, s, users, who, natscreds.GenerateSeed)
			report(cmd.OutOrStdout(), "NATS credentials", s.Namespace, done)
			if err != nil {
				return err
			}
			if hookUser != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "now restart NATS, then the pods serving hook user %s (they mount %s):\n"+
					"  kubectl -n %s rollout restart statefulset -l app.kubernetes.io/component=nats\n"+
					"  kubectl -n %s rollout status statefulset -l app.kubernetes.io/component=nats\n",
					hookUser, natscreds.HookSecret(hookUser), s.Namespace, s.Namespace)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "now restart NATS, then the %s:\n"+
				"  kubectl -n %s rollout restart statefulset -l app.kubernetes.io/component=nats\n"+
				"  kubectl -n %s rollout status statefulset -l app.kubernetes.io/component=nats\n"+
				"  kubectl -n %s rollout restart deployment -l app.kubernetes.io/component=%s\n",
				service, s.Namespace, s.Namespace, s.Namespace, service)
			return nil
		},
	}
	rotate.Flags().StringVar(&service, "service", "", "the service (or operator user) whose seed to replace: "+strings.Join(natscreds.Users, ", "))
	rotate.Flags().StringVar(&hookUser, "hook-user", "", "the hook user (made by ensure --hook-user) whose seed to replace")

	cmd.AddCommand(ensure, rotate, hookUsersCommand())
	return cmd
}

// hookUsersCommand is `metabus credentials hook-users`: the kustomize
// counterpart of the Helm chart's nats.hookUsers.
func hookUsersCommand() *cobra.Command {
	var conf, out string
	c := &cobra.Command{
		Use:   "hook-users --conf deploy/nats/nats-server.conf --out DIR NAME[:SUBJECT,...]...",
		Short: "Write a kustomize component adding NATS hook users to an install from deploy/",
		Long: `Writes DIR/kustomization.yaml, a kustomize component, and DIR/nats-server.conf:
the --conf file (the nats-server.conf of the install) with an entry for each
hook user NAME, who may subscribe to hooks.NAME.> (or the SUBJECTs given, each
under hooks.NAME.) and publish nothing but replies to the requests it got.
The component merges that file into the nats-config ConfigMap, adds
--hook-user=NAME to "credentials ensure" in the NATS pods' init container
(which then makes the seed Secret metabus-nats-hook-NAME for the hook's pods,
its public key and certificate) and lets the credentials Role write those
Secrets. Use it from your kustomization:

  resources:
  - github.com/metabus/metabus/deploy
  components:
  - ./DIR`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if conf == "" || out == "" {
				return errors.New("--conf and --out are required")
			}
			users := make([]natscreds.HookUser, len(args))
			for i, a := range args {
				u, err := natscreds.ParseHookUser(a)
				if err != nil {
					return err
				}
				users[i] = u
			}
			data, err := os.ReadFile(conf)
			if err != nil {
				return err
			}
			files, err := natscreds.HookUsersComponent(string(data), users)
			if err != nil {
				return fmt.Errorf("%s: %w", conf, err)
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			for _, name := range []string{natscreds.ComponentConf, natscreds.ComponentKustomization} {
				if err := os.WriteFile(filepath.Join(out, name), files[name], 0o644); err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote the kustomize component %s (hook users %s)\n", out, strings.Join(args, " "))
			return nil
		},
	}
	c.Flags().StringVar(&conf, "conf", "", "the install's nats-server.conf (deploy/nats/nats-server.conf), with its # @hook-users line")
	c.Flags().StringVar(&out, "out", "", "directory to write the component to (created if missing; its two files are replaced)")
	return c
}

// credentialsNamespace is the namespace the Secrets live in: the flag, the
// pod's own namespace in the cluster, else the shipped manifests'.
func credentialsNamespace(flag string) string {
	if flag != "" {
		return flag
	}
	if ns := strings.TrimSpace(os.Getenv("POD_NAMESPACE")); ns != "" {
		return ns
	}
	return defaultNamespace
}

// report prints what was written of what (the credentials, the TLS
// certificates); never a seed or a key.
func report(w io.Writer, what, namespace string, done []natscreds.Action) {
	if len(done) == 0 {
		fmt.Fprintf(w, "%s in namespace %s are complete: nothing to do\n", what, namespace)
		return
	}
	for _, a := range done {
		fmt.Fprintf(w, "namespace %s: %s\n", namespace, a)
	}
}

// tlsFlags are ensure's TLS settings.
type tlsFlags struct {
	enabled        bool
	service, peers string
	validity       time.Duration
}

// spec is what ensure makes in namespace: certificates for every one of
// users, the server's valid for the Services' names and for a
// port-forward.
func (f tlsFlags) spec(users []string, namespace string, now time.Time) natscreds.TLSSpec {
	return natscreds.TLSSpec{
		Users:     users,
		ServerDNS: natscreds.ServerDNSNames(f.service, f.peers, namespace),
		ServerIPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		Validity:  f.validity,
		Now:       now,
	}
}
