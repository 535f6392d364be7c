// Package helmchart tests the Helm chart charts/shardkeeper: that it
// renders the same objects as the kustomize install (config/default,
// config/namespaced, config/prometheus, config/grafana), that `helm lint`
// passes, that its values do what values.yaml says, and that the API server
// accepts what it renders.
//
// It is the only package that links Helm (helm.sh/helm/v3), so that no
// binary of the module does; hack/verify's TestImageBinariesLinkNoNATSServer
// checks the shipped binaries link neither Helm nor the NATS server.
package helmchart
