"""Push a folder that is already converted to the Hub, without converting it again.

    transformers-xl push FOLDER ORG/NAME [--private] [--revision BRANCH] [--dry-run]

FOLDER is what `transformers-xl convert` wrote (or a `save_pretrained` folder of this package's models). It must
hold a model: a config.json of a Transformer-XL or XLNet model and its safetensors weights (every shard its index
names). Every file of FOLDER goes up in one commit, as `convert --push-to` sends them.
"""


def add_arguments(parser):
    parser.add_argument("folder", metavar="FOLDER", help="a converted folder (what `transformers-xl convert` wrote)")
    parser.add_argument("repo", metavar="ORG/NAME", help="the model repo to upload to (created if missing)")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--revision", help="branch to commit to (created if missing)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be uploaded where, send nothing")


def run(args) -> int:
    from transformers_xl.conversion import push

    return push.run(args)
