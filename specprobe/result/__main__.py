"""python -m specprobe.result > docs/result.schema.json"""

import json

from specprobe.result import json_schema

print(json.dumps(json_schema(), indent=1, ensure_ascii=False))
