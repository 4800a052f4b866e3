// placeholder until the model layer lands
namespace moetrain {}
