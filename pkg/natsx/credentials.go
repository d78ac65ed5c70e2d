package natsx

// CredentialsLabel marks the Secrets that hold metabus's own NATS
// credentials (the per-service nkey seeds and the server's user list). The
// install's credential generator sets it on every Secret it creates, and the
// dispatcher refuses to read a Secret that carries it as a hook credential
// (authorization, basicAuth, clientTLS, endpointConfigs), whatever
// --secret-namespaces allows: a controller author who names
// `metabus-nats-applier` in a secretRef must not get the applier's seed sent
// to their URL.
const CredentialsLabel = "metabus.dev/nats-credentials"

// CredentialsSecretPrefix is the name prefix of those Secrets
// (metabus-nats-<service>, metabus-nats-users). A Secret in the dispatcher's
// own namespace with this prefix is refused as a hook credential even when
// it was made by hand without CredentialsLabel.
const CredentialsSecretPrefix = "metabus-nats-"
