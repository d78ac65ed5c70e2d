package informers

import (
	"io"
	"testing"

	sigsjson "sigs.k8s.io/json"
)

// repeatReader gives one watch event over and over, as a watch body
// would, in reads of up to 4 KiB (an HTTP/2 frame's worth of a body).
type repeatReader struct {
	event []byte
	off   int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && n < 4096 {
		c := copy(p[n:min(len(p), 4096)], r.event[r.off:])
		n += c
		r.off = (r.off + c) % len(r.event)
	}
	return n, nil
}

// benchCRJSON is a B1 parent as its watch sends it (managed fields,
// status written).
const benchCRJSON = `{"apiVersion":"bench.metabus.dev/v1","kind":"Bench","metadata":{"creationTimestamp":"2026-11-29T02:00:00Z","finalizers":["metacontroller.k8s.io/bench"],"generation":2,"labels":{"run":"b1"},"managedFields":[{"apiVersion":"bench.metabus.dev/v1","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:run":{}}},"f:spec":{".":{},"f:gen":{}}},"manager":"benchcmp","operation":"Update","time":"2026-11-29T02:00:00Z"},{"apiVersion":"bench.metabus.dev/v1","fieldsType":"FieldsV1","fieldsV1":{"f:status":{".":{},"f:childCount":{},"f:observedGeneration":{}}},"manager":"metabus","operation":"Update","subresource":"status","time":"2026-11-29T02:00:01Z"}],"name":"p-1234","namespace":"default","resourceVersion":"123456","uid":"0d4c4b58-1d4c-4b58-9d4c-4b581d4c4b58"},"spec":{"gen":2},"status":{"childCount":1,"observedGeneration":2}}`

func BenchmarkEventDecoder(b *testing.B) {
	for _, obj := range []struct{ name, json string }{{"Pod", podJSON}, {"BenchCR", benchCRJSON}} {
		event := []byte(`{"type":"MODIFIED","object":` + obj.json + "}\n")
		b.Run(obj.name+"/sigs.k8s.io-json", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(event)))
			r := &repeatReader{event: event}
			d := &eventDecoder{body: io.NopCloser(r), slow: sigsjson.NewDecoderCaseSensitivePreserveInts(r)}
			for b.Loop() {
				if _, _, err := d.Decode(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(obj.name+"/one-pass", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(event)))
			d := newEventDecoder(io.NopCloser(&repeatReader{event: event}))
			d.keys = newInterner().key // as an informer's watch does
			for b.Loop() {
				if _, _, err := d.Decode(); err != nil {
					b.Fatal(err)
				}
			}
			if d.slow != nil {
				b.Fatal("the one-pass path left the stream to sigs.k8s.io/json")
			}
		})
	}
}

// podJSON is a Pod as the API server sends it.
const podJSON = `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-7d4b9c8f6-x2k9p","generateName":"web-7d4b9c8f6-","namespace":"default","uid":"5c3b6f0e-8a9d-4e2f-b1c7-3d5e6f7a8b9c","resourceVersion":"123456","creationTimestamp":"2026-11-29T02:00:00Z","labels":{"app":"web","pod-template-hash":"7d4b9c8f6"},"annotations":{"kubectl.kubernetes.io/restartedAt":"2026-11-28T10:00:00Z"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-7d4b9c8f6","uid":"8a9d4e2f-b1c7-3d5e-6f7a-8b9c5c3b6f0e","controller":true,"blockOwnerDeletion":true}],"managedFields":[{"manager":"kube-controller-manager","operation":"Update","apiVersion":"v1","time":"2026-11-29T02:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"8a9d4e2f-b1c7-3d5e-6f7a-8b9c5c3b6f0e\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{".":{},"f:image":{},"f:name":{},"f:ports":{}}}}}}]},"spec":{"volumes":[{"name":"kube-api-access-abcde","projected":{"sources":[{"serviceAccountToken":{"expirationSeconds":3607,"path":"token"}},{"configMap":{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}}],"defaultMode":420}}],"containers":[{"name":"web","image":"nginx:1.27","ports":[{"containerPort":80,"protocol":"TCP"}],"resources":{"limits":{"cpu":"500m","memory":"128Mi"},"requests":{"cpu":"250m","memory":"64Mi"}},"volumeMounts":[{"name":"kube-api-access-abcde","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}],"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent"}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","serviceAccount":"default","nodeName":"node-1","securityContext":{},"schedulerName":"default-scheduler","tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}],"priority":0,"enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-11-29T02:00:05Z"}],"hostIP":"10.0.0.5","podIP":"10.244.1.17","podIPs":[{"ip":"10.244.1.17"}],"startTime":"2026-11-29T02:00:00Z","containerStatuses":[{"name":"web","state":{"running":{"startedAt":"2026-11-29T02:00:04Z"}},"lastState":{},"ready":true,"restartCount":0,"image":"docker.io/library/nginx:1.27","imageID":"docker.io/library/nginx@sha256:0123456789abcdef","containerID":"containerd://abcdef0123456789","started":true}],"qosClass":"Burstable"}}`
