{{/*
Names. The release name is the application's name (a DNS label of at most 53 characters), so
every suffixed name below stays within 63 characters.
*/}}
{{- define "queue-worker.name" -}}
{{- .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- end -}}

{{- define "queue-worker.serviceAccountName" -}}
{{- default (include "queue-worker.name" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- /* The Secret of spark.authenticate: sparkAuth.existingSecret, else the one the chart makes. */}}
{{- define "queue-worker.sparkAuthSecret" -}}
{{- .Values.sparkAuth.existingSecret | default (printf "%s-spark-auth" (include "queue-worker.name" .)) -}}
{{- end -}}

{{- define "queue-worker.driverService" -}}
{{- printf "%s-driver" (include "queue-worker.name" .) -}}
{{- end -}}

{{- define "queue-worker.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (required "image.tag or image.digest must be set" .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "queue-worker.selectorLabels" -}}
app.kubernetes.io/name: queue-worker
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{- define "queue-worker.labels" -}}
{{ include "queue-worker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: queueplane
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
queueplane.io/team: {{ .Values.application.team | quote }}
queueplane.io/application: {{ .Values.application.name | quote }}
{{- end -}}

{{/*
Spark settings no value may set (queueplane/deploy/spark_conf.py holds the same patterns, and
values.schema.json refuses the same names): RPC authentication and encryption, TLS, host-path
volumes, pod templates, the driver's Kubernetes credentials, credentials by name, and the
environment variables that name the Kafka properties file or Spark's secret.
*/}}
{{- define "queue-worker.refusedSparkKey" -}}
(?i)password|secret|jaas|token|credential|access[._-]?key|account\.key|key[._-]?file|keytab|keystore|truststore|^spark\.authenticate($|\.)|^spark\.network\.crypto\.|^spark\.network\.sasl\.|^spark\.io\.encryption\.|^spark\.ssl($|\.)|^spark\.kubernetes\.(driver|executor)\.volumes\.hostpath\.|^spark\.kubernetes\.(driver|executor)\.podtemplate|^spark\.kubernetes\.authenticate\.|^spark\.(executorenv|kubernetes\.driverenv|yarn\.appmasterenv)\.(queueplane_|_?spark_|java_tool_options$|jdk_java_options$|_java_options$)
{{- end -}}

{{/* What Java options of a Spark process may not hold: -Dspark.* (unchecked settings), @files,
credential-file properties, quotes and escapes. */}}
{{- define "queue-worker.refusedJavaOptions" -}}
(?i)['\"\\]|(^|\s)(@|-Dspark\.|-Djava\.security\.auth\.|-Djavax\.net\.ssl\.)
{{- end -}}

{{- define "queue-worker.javaOptionsKey" -}}
(?i)^spark\.(driver|executor|yarn\.am)\.(extra|default)JavaOptions$
{{- end -}}

{{/* Mount points, shared by the driver, the executor pod template and the Spark settings. */}}
{{- define "queue-worker.specDir" -}}/etc/queueplane/spec{{- end -}}
{{- define "queue-worker.executorDir" -}}/etc/queueplane/executor{{- end -}}
{{- define "queue-worker.kafkaDir" -}}/etc/queueplane/kafka{{- end -}}
{{- define "queue-worker.tlsDir" -}}/etc/queueplane/kafka-tls{{- end -}}
{{- define "queue-worker.sparkAuthDir" -}}/etc/queueplane/spark-auth{{- end -}}
{{- define "queue-worker.localDir" -}}/var/spark/local{{- end -}}
{{- define "queue-worker.checkpointDir" -}}/var/queueplane/checkpoints{{- end -}}

{{- define "queue-worker.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The image's spark user (uid 185 in the Apache Spark images). */}}
{{- define "queue-worker.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 185
runAsGroup: 185
fsGroup: 185
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
Where a pod runs: the top-level nodeSelector and tolerations with the pod's own (driverPod or
executorPod) over them, its affinity, spread constraints and priority class, and the pull
secrets. Called with (dict "root" $ "pod" <driverPod|executorPod> "nodeSelector" <bool>): the
executors take their node selector from Spark's settings instead (deployment.yaml).
*/}}
{{- define "queue-worker.scheduling" -}}
{{- $root := .root }}
{{- $pod := .pod }}
{{- if .nodeSelector }}
{{- with merge (deepCopy ($pod.nodeSelector | default dict)) ($root.Values.nodeSelector | default dict) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- with concat ($root.Values.tolerations | default list) ($pod.tolerations | default list) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $pod.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $pod.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $pod.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . | quote }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
Environment variables no value may set (queueplane/deploy/cluster_values.py and values.schema.json
refuse the same): the chart's own and Spark's, and the JVM's option variables. A later entry
of the same name would win over the chart's.
*/}}
{{- define "queue-worker.refusedEnvName" -}}
(?i)^(queueplane_|_?spark_|pyspark_|java_tool_options$|jdk_java_options$|_java_options$|pod_name$|home$|pythonpath$)
{{- end -}}

{{- define "queue-worker.credentialName" -}}
(?i)password|secret|jaas|token|credential|access[._-]?key|account\.key|key[._-]?file|keytab|keystore|truststore
{{- end -}}

{{/* The volume kinds Pod Security "restricted" admits; a hostPath is never among them. */}}
{{- define "queue-worker.volumeKinds" -}}
emptyDir configMap secret persistentVolumeClaim projected downwardAPI csi ephemeral
{{- end -}}

{{/*
The refusals of driverPod and executorPod that the values schema makes, made again so that
`helm --skip-schema-validation` changes nothing: host paths and other volume kinds, the chart's
and Spark's variables, and credentials written into values.
*/}}
{{- define "queue-worker.checkPodExtensions" -}}
{{- $kinds := splitList " " (include "queue-worker.volumeKinds" .) }}
{{- $refusedEnv := include "queue-worker.refusedEnvName" . }}
{{- $credential := include "queue-worker.credentialName" . }}
{{- range $role := list "driverPod" "executorPod" }}
{{- $pod := index $.Values $role }}
{{- range $i, $volume := $pod.extraVolumes }}
{{- range $key, $_ := $volume }}
{{- if and (ne $key "name") (not (has $key $kinds)) }}
{{- fail (printf "%s.extraVolumes[%d].%s is refused: a worker's volumes are of the kinds Pod Security restricted admits (%s), never a host path" $role $i $key (join ", " $kinds)) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $i, $env := $pod.extraEnv }}
{{- if regexMatch $refusedEnv (toString $env.name) }}
{{- fail (printf "%s.extraEnv[%d] %s is refused: the chart's, Spark's and the JVM's own variables are the platform's" $role $i $env.name) }}
{{- end }}
{{- if and (hasKey $env "value") (regexMatch $credential (toString $env.name)) }}
{{- fail (printf "%s.extraEnv[%d] %s is refused with a literal value: credentials never go into values; use valueFrom.secretKeyRef" $role $i $env.name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The executor pod template. Spark fills in the image, command, resources, its environment and
the node selector (spark.kubernetes.executor.node.selector.*); this adds what Spark has no
setting for: labels, security, writable scratch space, the TLS files, and executorPod's
tolerations, affinity, spread constraints, priority class, variables and volumes.
Volumes named spark-local-dir-* are used by Spark as its local directories.
*/}}
{{- define "queue-worker.executorPodTemplate" -}}
apiVersion: v1
kind: Pod
metadata:
  labels:
    {{- include "queue-worker.labels" . | nindent 4 }}
    app.kubernetes.io/component: executor
  {{- with .Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  securityContext:
    {{- include "queue-worker.podSecurityContext" . | nindent 4 }}
  {{- with include "queue-worker.scheduling" (dict "root" . "pod" .Values.executorPod "nodeSelector" false) }}
  {{- . | trim | nindent 2 }}
  {{- end }}
  containers:
    - name: executor
      securityContext:
        {{- include "queue-worker.containerSecurityContext" . | nindent 8 }}
      {{- with .Values.executorPod.extraEnv }}
      # Spark adds its own variables after these.
      env:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        - name: spark-local-dir-1
          mountPath: {{ include "queue-worker.localDir" . }}
        {{- if .Values.kafka.tlsSecret.name }}
        - name: kafka-tls
          mountPath: {{ include "queue-worker.tlsDir" . }}
          readOnly: true
        {{- end }}
        {{- with .Values.executorPod.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    - name: spark-local-dir-1
      emptyDir: {}
    {{- if .Values.kafka.tlsSecret.name }}
    - name: kafka-tls
      secret:
        secretName: {{ .Values.kafka.tlsSecret.name | quote }}
    {{- end }}
    {{- with .Values.executorPod.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
