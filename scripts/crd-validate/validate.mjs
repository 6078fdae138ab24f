// Validates the custom resources in rendered manifests against the schemas generated from their
// CRDs (kubernetes-models), which kubernetes-validate does not know. Types, enums, patterns and
// required fields are checked; unknown fields are not (CRD schemas leave that to the API server).
//   node validate.mjs rendered.yaml [...]
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { parseAllDocuments } from "yaml";
import { HTTPRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";

const MODELS = {
  "gateway.networking.k8s.io/v1 HTTPRoute": HTTPRoute,
  "monitoring.coreos.com/v1 ServiceMonitor": ServiceMonitor,
  "monitoring.coreos.com/v1 PrometheusRule": PrometheusRule,
};

let failed = false;
let validated = 0;
for (const file of process.argv.slice(2)) {
  for (const document of parseAllDocuments(readFileSync(file, "utf8"))) {
    const manifest = document.toJS();
    const Model = manifest && MODELS[`${manifest.apiVersion} ${manifest.kind}`];
    if (!Model) continue;
    const name = `${basename(file)}: ${manifest.kind}/${manifest.metadata?.name}`;
    try {
      validated += 1;
      new Model(manifest).validate();
      console.log(`ok   CRD schema: ${name}`);
    } catch (error) {
      console.log(`FAIL CRD schema: ${name}\n       ${error.message}`);
      failed = true;
    }
  }
}
if (validated === 0) {
  console.log("FAIL CRD schema: no HTTPRoute, ServiceMonitor or PrometheusRule in the manifests given");
  failed = true;
}
process.exit(failed ? 1 : 0);
