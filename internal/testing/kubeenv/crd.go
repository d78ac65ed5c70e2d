package kubeenv

import "strings"

// FreeformCRD is the manifest of a namespaced custom resource kind in group
// (version v1) with the status subresource and free-form spec and status:
// the parent type the benchmarks and the fault suite give their
// controllers.
func FreeformCRD(group, kind, plural string) string {
	singular := strings.ToLower(kind)
	return `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: ` + plural + `.` + group + `
spec:
  group: ` + group + `
  scope: Namespaced
  names:
    plural: ` + plural + `
    singular: ` + singular + `
    kind: ` + kind + `
    listKind: ` + kind + `List
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-preserve-unknown-fields: true
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
`
}
