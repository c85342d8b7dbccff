"""Validates OCSF records (one JSON object per line) against the published OCSF JSON
Schema of the version each record names in metadata.version, as packaged by PyPI's
ocsf-json-schema, with jsonschema (Draft 2020-12) and format checks on.

Usage: python validate_ocsf.py FILE.  Prints one JSON summary line:
{"records": N, "errors": [...], "classes": {...}} and exits 0 only with zero errors.
"""

import json
import sys

import jsonschema
from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema


def main(path):
    schemas = {}
    validators = {}
    errors = []
    classes = {}
    records = 0
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            records += 1
            record = json.loads(line)
            version = record.get("metadata", {}).get("version")
            class_uid = record.get("class_uid")
            profiles = tuple(sorted(record.get("metadata", {}).get("profiles", [])))
            if version not in schemas:
                schemas[version] = OcsfJsonSchemaEmbedded(get_ocsf_schema(version=version))
            key = (version, class_uid, profiles)
            if key not in validators:
                ocsf = schemas[version]
                name = ocsf.lookup_class_name_from_uid(class_uid=class_uid)
                schema = ocsf.get_class_schema(class_name=name, profiles=list(profiles))
                cls = jsonschema.validators.validator_for(schema)
                cls.check_schema(schema)
                validators[key] = cls(schema, format_checker=cls.FORMAT_CHECKER)
            classes[str(class_uid)] = classes.get(str(class_uid), 0) + 1
            for error in validators[key].iter_errors(record):
                errors.append({
                    "line": number,
                    "class_uid": class_uid,
                    "path": "/".join(str(p) for p in error.absolute_path),
                    "message": error.message[:300],
                })
    print(json.dumps({"records": records, "errors": errors, "classes": classes}))
    return 0 if not errors and records > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
